-- The roles' privileges on what the migrations made: run as trioworker_migrator (the
-- owner) after EVERY `python -m trioworker migrate`, so that new tables and functions
-- are covered. Safe to run again. One transaction: no role ever sees a moment with less
-- than it is given here. See roles.md, whose table says which role does what.

BEGIN;

-- Start from none: what follows is all the three roles have on the queue's schema (a
-- grant that an earlier version of this script made, and this one does not, goes).
REVOKE ALL ON ALL TABLES IN SCHEMA trioworker
    FROM trioworker_client, trioworker_worker, trioworker_operator;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA trioworker
    FROM trioworker_client, trioworker_worker, trioworker_operator;
REVOKE ALL ON ALL ROUTINES IN SCHEMA trioworker
    FROM PUBLIC, trioworker_client, trioworker_worker, trioworker_operator;

-- Read: the items (their results too), their attempts and steps, the Workers, schedules,
-- pauses and limits (`show`, `status`, the results an application waits for), and which migrations were applied
-- (every command checks the schema first), and the scopes whose rate window is spent
-- (an enqueue's trigger places an item arriving in one behind). Not the failover guard
-- nor the scopes noted for settling: only the transitions read those. Nothing at all on the queue's own locks
-- (work_settle_locks, work_claim_locks, migrations/0001.queue.sql): locking a row
-- needs a privilege on its table, and only the transitions, running as the owner, take
-- them, so no role can hold one and stop the claims or settles of its scopes.
GRANT SELECT ON TABLE work_items, work_attempts, work_workers, work_schedules, work_pauses,
    work_limits, work_rate_slots, work_spent_scopes, work_steps, work_dependencies,
    _yoyo_migration
    TO trioworker_client, trioworker_worker, trioworker_operator;

-- Enqueue, by every path (the CLI, Client, AsyncClient, a plain INSERT): the columns an
-- enqueue sets, and no other. So an inserted row is Queued (Waiting, with `after`),
-- attempt 0, with no lease, slot, Worker, result or history of its own: the defaults.
GRANT INSERT (kind, scope, payload, priority, dedup_key, run_after, trace_context, after)
    ON TABLE work_items TO trioworker_client, trioworker_worker, trioworker_operator;

-- A Worker renews its leases and notes a success in its handler's own transaction
-- (work_heartbeat_v1, work_fence_v1, work_complete_v1, which run as their caller; a row lock needs
-- UPDATE of a column, as does `held_leases`, whose work_held_leases_v1 runs as its caller
-- and tries the expired rows' locks), registers itself and keeps its schedules. Its other writes are
-- transitions (below).
GRANT UPDATE (lease_expires_at, heartbeat_at, completed_at) ON TABLE work_items
    TO trioworker_worker;
GRANT INSERT, UPDATE ON TABLE work_workers, work_schedules TO trioworker_worker;

-- The transitions. Every version of each (work_NAME_vN) runs as the migrator (SECURITY
-- DEFINER, work_secure_transitions in migrations/0001.queue.sql), so EXECUTE on it is
-- the right to make it. The heartbeat, the fence and work_complete_v1 run as their
-- caller, under the column grants above.
DO $$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT p.oid::regprocedure AS f, w.roles
        FROM (VALUES
            ('request_cancel', 'trioworker_client, trioworker_worker, trioworker_operator'),
            ('claim', 'trioworker_worker'),
            ('failover_hold', 'trioworker_worker'),
            ('finish', 'trioworker_worker'),
            ('finish_result', 'trioworker_worker'),
            ('complete_result', 'trioworker_worker'),
            ('record_step', 'trioworker_worker'),
            ('requeue', 'trioworker_worker'),
            ('recover', 'trioworker_worker'),
            ('settle_noted', 'trioworker_worker'),
            ('repair', 'trioworker_worker'),
            ('delete_finished', 'trioworker_worker, trioworker_operator'),
            ('declare_limit', 'trioworker_worker'),
            ('set_limit', 'trioworker_operator'),
            ('clear_limit', 'trioworker_operator'),
            ('pause', 'trioworker_operator'),
            ('resume', 'trioworker_operator'),
            ('retry', 'trioworker_operator')
        ) AS w (transition, roles)
        JOIN pg_proc AS p ON p.proname ~ ('^work_' || w.transition || '_v[0-9]+$')
        WHERE p.pronamespace = 'trioworker'::regnamespace
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', t.f, t.roles);
    END LOOP;
END
$$;

-- Every other function runs with its caller's own privileges (a CHECK's, a trigger's
-- that needs no more, a transition's helper): each role may call them, and they can do
-- no more than it may.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid FROM pg_proc AS p
        WHERE p.pronamespace = 'trioworker'::regnamespace AND NOT p.prosecdef
    LOOP
        EXECUTE format('GRANT EXECUTE ON ROUTINE %s'
                       ' TO trioworker_client, trioworker_worker, trioworker_operator', f);
    END LOOP;
END
$$;

-- The application's tables (made by its own migrations, `migrate --app`; none is named
-- work_...): the Worker's handlers read and write them, and draw from their sequences.
DO $$
DECLARE
    r regclass;
BEGIN
    FOR r IN
        SELECT c.oid FROM pg_class AS c
        WHERE c.relnamespace = 'trioworker'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'S')
          AND c.relname !~ '^(work_|_yoyo_|yoyo_lock$)'
    LOOP
        IF (SELECT relkind FROM pg_class WHERE oid = r) = 'S' THEN
            EXECUTE format('GRANT USAGE, SELECT ON SEQUENCE %s TO trioworker_worker', r);
        ELSE
            EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %s'
                           ' TO trioworker_worker', r);
        END IF;
    END LOOP;
END
$$;

COMMIT;
