-- The Worker role's privileges on what the migrations made: run as trioworker_migrator
-- (the owner) after EVERY `python -m trioworker migrate`, so new tables are covered.
-- Safe to run again. See roles.md.

-- Rows, not schema: read and write every table of the queue (work_items, and the
-- tables of apps shipped in its migrations), and draw ids from their sequences.
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA trioworker TO trioworker_worker;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA trioworker TO trioworker_worker;

-- The migration bookkeeping is the migrator's: a Worker only reads which migrations
-- were applied (`run` refuses to start on a schema it does not know).
REVOKE ALL ON TABLE _yoyo_migration, _yoyo_log, _yoyo_version, yoyo_lock
    FROM trioworker_worker;
GRANT SELECT ON TABLE _yoyo_migration TO trioworker_worker;

-- The triggers (scope heads, NOTIFY) run as the role whose write fired them and call
-- work_items_refresh_head(text), which checks EXECUTE for that role.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA trioworker FROM PUBLIC;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA trioworker TO trioworker_worker;
