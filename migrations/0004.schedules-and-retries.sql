-- Periodic items, and retrying failed items by hand.
-- depends: 0003.workers

-- Each schedule's next due time, held by the database: a Worker that finds it past
-- locks the row (SKIP LOCKED: another Worker is already firing it), enqueues one item
-- for the most recent due time, and moves it on, all in one transaction. Workers that
-- carry a schedule write its definition here when they start; a changed definition
-- (spec) starts it afresh.
CREATE TABLE work_schedules (
    name       text        PRIMARY KEY,
    kind       text        NOT NULL,
    scope      text,
    payload    jsonb       NOT NULL DEFAULT '{}'::jsonb,
    priority   integer     NOT NULL DEFAULT 0,
    spec       text        NOT NULL,
    next_due   timestamptz NOT NULL,
    last_due   timestamptz,
    last_item  bigint,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX work_schedules_next_due ON work_schedules (next_due);

-- Put finished items back to Queued with a fresh attempt budget (failures and stalls
-- back to zero; attempt numbers go on, so the history of attempts is kept), due now.
-- Only Failed or Cancelled items are retried; one whose dedup key a Queued item holds
-- is left as it is. Returns the ids retried.
CREATE FUNCTION work_retry(p_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
AS $$
DECLARE
    was text := current_setting('trioworker.internal', true);
    r record;
    scopes text[] := '{}';
BEGIN
    PERFORM set_config('trioworker.internal', 'on', true);
    FOR r IN
        SELECT w.id, w.scope, w.dedup_key FROM work_items AS w
        WHERE w.id = ANY(p_ids) AND w.status IN ('Failed', 'Cancelled')
        ORDER BY w.id
        FOR UPDATE OF w SKIP LOCKED
    LOOP
        CONTINUE WHEN r.dedup_key IS NOT NULL AND EXISTS (
            SELECT 1 FROM work_items AS q
            WHERE q.dedup_key = r.dedup_key AND q.status = 'Queued');
        UPDATE work_items
        SET status = 'Queued', is_head = false, run_after = now(), finished_at = NULL,
            failures = 0, stalls = 0, reason = NULL, cancel_requested = false,
            worker_id = NULL, lease_expires_at = NULL
        WHERE id = r.id;
        scopes := scopes || r.scope;
        IF r.scope IS NULL THEN
            PERFORM pg_notify('trioworker', '');
        END IF;
        RETURN NEXT r.id;
    END LOOP;
    PERFORM work_settle_scopes(scopes);
    PERFORM set_config('trioworker.internal', COALESCE(was, ''), true);
END
$$;
