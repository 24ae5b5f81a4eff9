-- A success committed in a handler's own transaction keeps its scope (issue 31).
--
-- A handler that completes in its fenced transaction (`tx.complete()`) used to finish
-- its item Succeeded in that commit, which freed the scope's slot (and a limited kind's)
-- while the handler's own code went on: a `finally` cleaning a folder of the scope could
-- overlap the next item's attempt. Now that commit only notes the success, in
-- completed_at: durable (a Worker that dies right after it must not run the item again),
-- but the row stays Running, so its slots stay taken (the slot indexes and
-- work_items_take_slot hold them, as for any Running row) until the Worker finishes it
-- once the handler has returned. From then on:
--
-- * work_finish_v2 finishes it Succeeded as before, and refuses to fail or cancel it;
-- * work_requeue_v2 (release, retry) passes it over: nothing is written for it;
-- * work_recover_v2 finishes it Succeeded when its lease runs out (its Worker died after
--   the commit, or before it could finish it), counting no stall;
-- * work_request_cancel_v2 leaves it alone (the caller hears "already finished").
--
-- The v1 functions stay as they were for Workers of the earlier version, which never
-- set completed_at. The CHECK below holds the rule for every writer, v1 and plain SQL
-- too: a completed row can become Succeeded and nothing else (a v1 fail or requeue of it
-- is refused by the constraint's name, never applied). So during a rolling deploy, an
-- earlier Worker's lease recovery that meets an expired completed row is refused as a
-- whole (it logs and tries again next time); the new Workers' recovery finishes it.
-- depends: 0006.scope-checks

-- When the attempt committed its success in its own fenced transaction (NULL: it did
-- not; the item is finished by the Worker's own write, or not yet).
ALTER TABLE work_items ADD COLUMN completed_at timestamptz;
ALTER TABLE work_items ADD CONSTRAINT work_items_completed_only_running_or_succeeded
    CHECK (completed_at IS NULL OR status IN ('Running', 'Succeeded'));

-- work_finish_v1, where an attempt that committed its success in its own transaction
-- (completed_at set) can only be finished Succeeded: a Failed or Cancelled write of it
-- applies nothing (it is not among the ids returned).
CREATE FUNCTION work_finish_v2(
    p_ids bigint[], p_attempts integer[], p_status text,
    p_reason text DEFAULT NULL, p_error text DEFAULT NULL, p_wait boolean DEFAULT true,
    p_traceback text DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
DECLARE
    was text := work_internal_begin();
    was_timeout text := current_setting('lock_timeout');
    done_ids bigint[];
    done_scopes text[];
BEGIN
    IF p_status NOT IN ('Succeeded', 'Failed', 'Cancelled') THEN
        RAISE EXCEPTION 'work_finish_v2: % is not a final status', p_status;
    END IF;

    -- One UPDATE, tried at most twice: with p_wait false the first try waits 50 ms at
    -- most for a held row, and the second passes over the rows still held.
    FOR pass IN 1..2 LOOP
        BEGIN
            IF NOT p_wait AND pass = 1 THEN
                PERFORM set_config('lock_timeout', '50ms', true);
            END IF;
            WITH done AS (
                UPDATE work_items AS w
                SET status = p_status, finished_at = now(), lease_expires_at = NULL,
                    reason = CASE WHEN p_status = 'Succeeded' THEN w.reason ELSE p_reason END,
                    error = CASE WHEN p_status = 'Failed' THEN p_error ELSE w.error END,
                    traceback = CASE WHEN p_status = 'Failed' THEN p_traceback
                                     ELSE w.traceback END,
                    failures = w.failures + (p_status = 'Failed')::integer
                FROM unnest(p_ids, p_attempts) AS d (id, attempt)
                WHERE w.id = d.id AND w.attempt = d.attempt AND w.status = 'Running'
                  AND (p_status = 'Succeeded' OR w.completed_at IS NULL)
                  AND (pass = 1 OR w.id IN (SELECT l.id FROM work_items AS l
                                            WHERE l.id = ANY(p_ids) AND l.status = 'Running'
                                            FOR UPDATE SKIP LOCKED))
                RETURNING w.id, w.scope
            )
            SELECT array_agg(done.id),
                   array_agg(done.scope) FILTER (WHERE done.scope IS NOT NULL)
            INTO done_ids, done_scopes FROM done;
            PERFORM set_config('lock_timeout', was_timeout, true);
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            -- Another transaction holds one of the rows: the next pass writes the rest;
            -- the caller writes that one on its own.
            NULL;
        END;
    END LOOP;
    IF p_status <> 'Succeeded' AND done_ids IS NOT NULL THEN
        -- Its attempt, worker and start are still on the row.
        PERFORM work_note_attempt(d, lower(p_status), p_error, p_traceback)
        FROM unnest(done_ids) AS d;
    END IF;
    IF done_scopes IS NOT NULL THEN
        PERFORM work_settle_scopes(done_scopes);
    END IF;
    PERFORM work_internal_end(was);
    RETURN QUERY SELECT unnest(done_ids);
END
$$;

-- work_requeue_v1, passing over an attempt that committed its success in its own
-- transaction: its release or retry writes nothing (no row comes back for it).
CREATE FUNCTION work_requeue_v2(
    p_ids bigint[], p_attempts integer[], p_cause text,
    p_delay double precision DEFAULT 0, p_error text DEFAULT NULL,
    p_traceback text DEFAULT NULL
) RETURNS TABLE (id bigint, status text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
#variable_conflict use_column
DECLARE
    was text := work_internal_begin();
    r record;
    ended text;
    scopes text[] := '{}';
BEGIN
    IF p_cause NOT IN ('release', 'retry') THEN
        RAISE EXCEPTION 'work_requeue_v2: cause must be release or retry, not %', p_cause;
    END IF;
    FOR r IN
        SELECT w.id, w.scope, w.run_after FROM work_items AS w
        JOIN unnest(p_ids, p_attempts) AS d (id, attempt)
          ON w.id = d.id AND w.attempt = d.attempt
        WHERE w.status = 'Running' AND w.completed_at IS NULL
        ORDER BY w.id
        FOR UPDATE OF w
    LOOP
        ended := work_requeue_row(r.id, p_cause, p_delay, p_error, p_traceback);
        id := r.id;
        status := ended;
        RETURN NEXT;
        scopes := scopes || r.scope;
        IF ended = 'Queued' AND r.scope IS NULL AND p_cause = 'release' THEN
            PERFORM pg_notify('trioworker', '');
        END IF;
    END LOOP;
    PERFORM work_settle_scopes(scopes);
    PERFORM work_internal_end(was);
END
$$;

-- work_recover_v1, where an expired attempt that committed its success in its own
-- transaction is finished Succeeded (no stall counted, its Worker kept on the row, so
-- its history reads `succeeded` as any success's does): its Worker died after the
-- commit, or was cut off before it could finish the item.
CREATE FUNCTION work_recover_v2(p_max_stalls integer, p_batch integer)
RETURNS TABLE (
    id bigint, kind text, scope text, attempt integer, stalls integer,
    status text, reason text
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
#variable_conflict use_column
DECLARE
    was text := work_internal_begin();
    r record;
    ended text;
    scopes text[] := '{}';
BEGIN
    FOR r IN
        SELECT w.id, w.kind, w.scope, w.attempt, w.stalls, w.cancel_requested, w.completed_at
        FROM work_items AS w
        WHERE w.status = 'Running' AND w.lease_expires_at < now()
        ORDER BY w.lease_expires_at
        LIMIT p_batch
        FOR UPDATE SKIP LOCKED
    LOOP
        IF r.completed_at IS NOT NULL THEN
            UPDATE work_items AS w
            SET status = 'Succeeded', finished_at = now(), lease_expires_at = NULL
            WHERE w.id = r.id;
        ELSIF r.stalls + 1 >= p_max_stalls OR r.cancel_requested THEN
            PERFORM work_note_attempt(r.id, 'stalled', 'lease expired');
            UPDATE work_items AS w
            SET status = CASE WHEN r.stalls + 1 >= p_max_stalls THEN 'Failed' ELSE 'Cancelled' END,
                reason = CASE WHEN r.stalls + 1 >= p_max_stalls THEN 'stalled'
                              ELSE 'cancel requested' END,
                stalls = w.stalls + 1, finished_at = now(), worker_id = NULL,
                lease_expires_at = NULL
            WHERE w.id = r.id
            RETURNING w.status INTO ended;
        ELSE
            ended := work_requeue_row(r.id, 'stall', 0, NULL);
            CONTINUE WHEN ended = 'Running';
        END IF;
        scopes := scopes || r.scope;
        RETURN QUERY SELECT w.id, w.kind, w.scope, w.attempt, w.stalls, w.status, w.reason
                     FROM work_items AS w WHERE w.id = r.id;
    END LOOP;
    PERFORM work_settle_scopes(scopes);
    PERFORM work_internal_end(was);
END
$$;

-- work_request_cancel_v1, leaving an attempt that committed its success in its own
-- transaction alone: its success is durable, so it answers NULL (already finished).
CREATE FUNCTION work_request_cancel_v2(p_id bigint) RETURNS text
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
DECLARE
    was text := work_internal_begin();
    r record;
BEGIN
    UPDATE work_items
    SET status = CASE WHEN status = 'Queued' THEN 'Cancelled' ELSE status END,
        finished_at = CASE WHEN status = 'Queued' THEN now() ELSE finished_at END,
        reason = CASE WHEN status = 'Queued' THEN 'cancelled before it ran' ELSE reason END,
        is_head = false,
        cancel_requested = true
    WHERE id = p_id AND status IN ('Queued', 'Running') AND completed_at IS NULL
    RETURNING status, scope INTO r;
    IF r.status = 'Cancelled' THEN
        PERFORM work_settle_scopes(ARRAY[r.scope]);
    END IF;
    PERFORM work_internal_end(was);
    RETURN r.status;
END
$$;
