-- Results and durable steps, fenced like every other write of an attempt (issue 34;
-- docs/adr/0013-results-and-steps.md).
--
-- * work_items.result: a Succeeded item's result (its handler's return value, or what it
--   passed to `tx.complete(result=...)`), NULL for none. Written only by the two
--   transitions below, each fenced by (id, attempt) on a Running row: with the
--   Succeeded it belongs to, in one statement, never half.
-- * work_steps: one row per (item, step name): the JSON value an attempt's step
--   function returned, recorded by that attempt while it owned the item
--   (work_record_step_v1, called in the attempt's fenced transaction, which commits only
--   before its self-stop deadline). A later attempt reads it back instead of running
--   the step again. Deleted with its item.
--
-- A client role reads both (SELECT, docs/grants.sql) and writes neither: the columns it
-- may insert do not include `result`, it has no privilege on work_steps but SELECT, and
-- only a Worker may execute the three transitions here.
--
-- The bounds are the payload's (64 deep; the 128 KiB the table allows a payload, twice
-- what Python sends). On work_items they are a trigger's WHEN, not CHECKs: PostgreSQL
-- prepares every CHECK of a table again for each statement that writes one of its
-- rows (0001.queue.sql, section 1), and a claim, a heartbeat or a finish never sets `result`.
--
-- The first migration after the baseline (0001.queue): from here the schema is
-- append-only (ADR 0009). work_finish_result_v1 calls work_finish_v1, so the fence and
-- the finish are that function's; work_secure_transitions() is redefined whole below to
-- add the three names it secures.
-- depends: 0001.queue

ALTER TABLE work_items ADD COLUMN result jsonb;

-- Refuses the row, as a CHECK named work_items_result_bounded would (0001.queue.sql's
-- work_refuse_row does the same for its bounds; this one is its own, so that the
-- migration stands on what it makes).
CREATE FUNCTION work_items_result_refused() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'check_violation',
        CONSTRAINT = 'work_items_result_bounded',
        SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
        MESSAGE = 'new row for relation "work_items" violates work_items_result_bounded:'
                  ' a result is at most 131072 bytes as JSON text and nests at most 64 deep',
        DETAIL = format('Failing row has id = %s, status = %s.', NEW.id, NEW.status);
END
$$;

CREATE TRIGGER work_items_result_bounded
    BEFORE INSERT OR UPDATE OF result ON work_items
    FOR EACH ROW WHEN (NEW.result IS NOT NULL
                       AND (octet_length(NEW.result::text) > 131072
                            OR jsonb_path_exists(NEW.result, 'strict $.**{64}')))
    EXECUTE FUNCTION work_items_result_refused();

CREATE TABLE work_steps (
    item_id bigint NOT NULL REFERENCES work_items (id) ON DELETE CASCADE,
    name text NOT NULL,
    -- The attempt that recorded it (the one that owned the item then).
    attempt integer NOT NULL,
    result jsonb,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (item_id, name),
    CONSTRAINT work_steps_name_sane CHECK (length(name) BETWEEN 1 AND 200),
    CONSTRAINT work_steps_attempt_sane CHECK (attempt BETWEEN 1 AND 2147483647),
    CONSTRAINT work_steps_result_fits CHECK (octet_length(result::text) <= 131072),
    CONSTRAINT work_steps_result_depth CHECK (NOT jsonb_path_exists(result, 'strict $.**{64}')),
    CONSTRAINT work_steps_recorded_in_range
        CHECK (recorded_at BETWEEN '1900-01-01 00:00:00+00' AND '9000-01-01 00:00:00+00')
);

-- Succeeded with results, for many attempts at once; the ids written. The finish
-- itself is work_finish_v1's (Succeeded, with `p_wait` as there); each result is then
-- set on the rows that finish wrote, in the same transaction: an attempt the finish
-- passed over (fenced out, or a row another transaction held) gets no result either.
-- A NULL in p_results leaves the row's result as it is (an attempt that completed in
-- its own transaction wrote its result there).
CREATE FUNCTION work_finish_result_v1(
    p_ids bigint[], p_attempts integer[], p_results jsonb[], p_wait boolean DEFAULT true
) RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
DECLARE
    done_ids bigint[];
BEGIN
    IF cardinality(p_ids) <> cardinality(p_results)
       OR cardinality(p_ids) <> cardinality(p_attempts) THEN
        RAISE EXCEPTION 'work_finish_result_v1: ids, attempts and results differ in length';
    END IF;
    SELECT array_agg(f) INTO done_ids
    FROM work_finish_v1(p_ids, p_attempts, 'Succeeded', NULL, NULL, p_wait, NULL) AS f;
    IF done_ids IS NULL THEN
        RETURN;
    END IF;
    UPDATE work_items AS w SET result = d.result
    FROM unnest(p_ids, p_results) AS d (id, result)
    WHERE w.id = d.id AND w.id = ANY (done_ids) AND d.result IS NOT NULL
      AND w.status = 'Succeeded';
    PERFORM pg_notify('trioworker_result', d::text) FROM unnest(done_ids) AS d;
    RETURN QUERY SELECT unnest(done_ids);
END
$$;

-- A fenced transaction's last statement when the handler called
-- `tx.complete(result=...)`: complete_in_transaction's note of the success, with the
-- result, on the row lock_attempt locked. The id, or nothing if the attempt does not own
-- a Running item.
CREATE FUNCTION work_complete_result_v1(p_id bigint, p_attempt integer, p_result jsonb)
RETURNS SETOF bigint
LANGUAGE sql AS $$
    UPDATE work_items
    SET completed_at = COALESCE(completed_at, statement_timestamp()), result = p_result
    WHERE id = p_id AND attempt = p_attempt AND status = 'Running'
    RETURNING id;
$$;

-- A step's result, recorded by attempt (p_id, p_attempt) while it owns the Running
-- item (the caller's fenced transaction holds the row since lock_attempt; the check is
-- made again here under a row lock, for a caller that skipped it). Returns what is
-- recorded for the step: 'recorded' (this call recorded it), 'recorded before' (an
-- earlier attempt had: its value stands), or 'lost' (the attempt does not own the item;
-- nothing is written).
CREATE FUNCTION work_record_step_v1(
    p_id bigint, p_attempt integer, p_name text, p_result jsonb
) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM work_items
    WHERE id = p_id AND attempt = p_attempt AND status = 'Running'
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN 'lost';
    END IF;
    INSERT INTO work_steps (item_id, name, attempt, result)
    VALUES (p_id, p_name, p_attempt, p_result)
    ON CONFLICT (item_id, name) DO NOTHING;
    RETURN CASE WHEN FOUND THEN 'recorded' ELSE 'recorded before' END;
END
$$;

-- work_secure_transitions() of 0001.queue, whole, with the three transitions above.
CREATE OR REPLACE FUNCTION work_secure_transitions() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    home text := current_schema();
    path text := CASE WHEN current_schema() = 'public' THEN 'public, pg_temp'
                      ELSE format('%I, pg_catalog, pg_temp', current_schema()) END;
    f regprocedure;
    n integer := 0;
BEGIN
    FOR f IN
        SELECT p.oid FROM pg_catalog.pg_proc AS p
        JOIN pg_catalog.pg_namespace AS ns ON ns.oid = p.pronamespace
        WHERE ns.nspname = home
          AND (p.proname ~ ('^work_(claim|failover_hold|finish|requeue|recover|settle_noted'
                            '|repair|request_cancel|retry|pause|resume|set_limit|clear_limit'
                            '|declare_limit|delete_finished|finish_result|complete_result'
                            '|record_step)'
                            '_v[0-9]+$')
               OR p.proname IN ('work_items_confirm_place', 'work_limits_settle'))
          AND NOT (p.prosecdef
                   AND 'search_path=' || path = ANY (COALESCE(p.proconfig, '{}'))
                   AND NOT pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE'))
        ORDER BY p.oid
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %s', f, path);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

DO $$ BEGIN PERFORM work_secure_transitions(); END $$;
