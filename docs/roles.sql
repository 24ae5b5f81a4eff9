-- Least-privilege roles for trioworker: run as a superuser (or a role with CREATEROLE
-- that owns the database), connected to the queue's database. Safe to run again: it
-- creates what is missing (a setup made by an earlier version gains the new roles).
-- See roles.md, whose table says what each role may do.
--
--   trioworker_migrator  owns the schema `trioworker`; runs `python -m trioworker migrate`.
--   trioworker_client    applications: enqueue, read (show, status), cancel.
--   trioworker_worker    runs Workers: what a client may, and claim, heartbeat, finish.
--   trioworker_operator  operators: what a client may, and limits, pause, resume,
--                        quiesce, retry, prune (and a dashboard with --allow-actions).
--
-- The dashboard's read-only role (trioworker_dashboard) comes after `migrate`, from
-- docs/dashboard/readonly-role.sql (roles.md says why it is a script of its own).
--
-- Set their passwords afterwards (psql: \password trioworker_worker), then, as the
-- migrator, run `migrate` and docs/grants.sql.

DO $$
DECLARE
    wanted text;
BEGIN
    FOREACH wanted IN ARRAY ARRAY['trioworker_migrator', 'trioworker_client',
                                'trioworker_worker', 'trioworker_operator'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = wanted) THEN
            EXECUTE format('CREATE ROLE %I LOGIN', wanted);
        END IF;
    END LOOP;
    EXECUTE format(
        'GRANT CONNECT ON DATABASE %I TO trioworker_migrator, trioworker_client,'
        ' trioworker_worker, trioworker_operator',
        current_database()
    );
END
$$;

-- The queue's tables live in a schema the migrator owns: only the owner can change them.
CREATE SCHEMA IF NOT EXISTS trioworker AUTHORIZATION trioworker_migrator;
GRANT USAGE ON SCHEMA trioworker TO trioworker_client, trioworker_worker, trioworker_operator;
ALTER ROLE trioworker_migrator SET search_path = trioworker;
ALTER ROLE trioworker_client SET search_path = trioworker;
ALTER ROLE trioworker_worker SET search_path = trioworker;
ALTER ROLE trioworker_operator SET search_path = trioworker;

-- Nobody else may create objects in `public` (the default since PostgreSQL 15; older
-- servers let every role do so). Drop this line if other applications rely on it.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
