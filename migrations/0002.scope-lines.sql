-- How heads are kept, and every transition of a work item after its enqueue.
--
-- The rule for heads (docs/design/claim.md): the first Queued item of each line
-- (scope, kind, priority) of a free scope is a head; a busy or paused scope has none.
-- An extra head is harmless (the claim's NOT EXISTS and the unique index hold the
-- rule); a missing one would leave due work unclaimed, a wedge.
--
-- Two parties change lines, and they never wait on each other:
--
-- * trioworker's own transitions (claim, complete, fail, cancel, requeue, recovery,
--   request_cancel, pause) are the functions below. They run in the queue's own short
--   transactions and settle a scope's heads under the scope's settle lock (an
--   advisory lock only they take exclusively, in a fixed order, with a bounded wait).
--   They set trioworker.internal so the triggers leave their rows alone.
-- * Everyone else (an enqueue, COPY, an operator's UPDATE or DELETE, in any
--   transaction at any isolation level) is seen by triggers that take no lock and
--   wait on nothing. An item arriving in a line becomes a head unless something
--   certainly goes before it; at commit, an item placed behind checks that this is
--   still so while it holds the settle lock shared (try only, never waiting), so the
--   next settle of that scope cannot start before the commit and will see it. A head
--   or Running item changed or deleted by hand leaves its scope in
--   work_unsettled_scopes, which Workers settle on NOTIFY and every poll.
--
-- The queue's entry points plan their statements once per session (generic plans:
-- planning these costs more than running them), never JIT-compile them, and never
-- scan the table: every statement here has an index to read, and a plan made while
-- the table was small must not keep a sequential scan once it is large.
--
-- Advisory lock namespaces: 29815 settles a scope, 29816 claims one ('tw' = 29815).
-- depends: 0001.work-items

-- The settle lock of a scope: at once if free, else after a bounded wait (an enqueue
-- holds it shared only while it commits). False: it stayed taken, and the caller
-- leaves the scope in work_unsettled_scopes for a later settle.
CREATE FUNCTION work_lock_scope(p_scope text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    was text := current_setting('lock_timeout');
BEGIN
    IF pg_try_advisory_xact_lock(29815, hashtext(p_scope)) THEN
        RETURN true;
    END IF;
    BEGIN
        PERFORM set_config('lock_timeout', '100ms', true);
        PERFORM pg_advisory_xact_lock(29815, hashtext(p_scope));
        PERFORM set_config('lock_timeout', was, true);
        RETURN true;
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
END
$$;

-- Put heads where they belong in each of `p_scopes`: none in a busy or paused scope,
-- else the first item of each line. Each step is one statement over all the scopes (a
-- completion batch ends items in many; a statement per scope costs its executor
-- start-up and the table's CHECK constraints, prepared again for every statement that
-- writes a row). Rows other transactions hold are passed over (the next unheld item of
-- the line stands in) and their scopes are returned as unsettled. Call it holding the
-- scopes' settle locks. Returns how many items became heads.
CREATE FUNCTION work_settle_locked(
    p_scopes text[], OUT promoted integer, OUT unsettled text[]
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
AS $$
DECLARE
    wanted bigint[];
    missing bigint[];
    missing_scopes text[];
    missing_kinds text[];
    missing_priorities integer[];
    made_ids bigint[] := '{}';
    line record;
    stand_in bigint;
BEGIN
    -- The first item of each line of each free scope, and those of them not heads yet:
    -- a skip scan over each scope's lines, each step landing on the next line's first.
    WITH RECURSIVE
    free AS (
        SELECT f.scope FROM unnest(p_scopes) AS f (scope)
        WHERE NOT EXISTS (SELECT 1 FROM work_items AS r
                          WHERE r.scope = f.scope AND r.status = 'Running')
          AND NOT EXISTS (SELECT 1 FROM work_pauses AS p WHERE p.scope = f.scope)
    ),
    firsts AS (
        SELECT n.id, n.scope, n.kind, n.priority, n.is_head
        FROM free AS f
        CROSS JOIN LATERAL (
            SELECT w.id, w.scope, w.kind, w.priority, w.is_head FROM work_items AS w
            WHERE w.scope = f.scope AND w.status = 'Queued'
            ORDER BY w.kind, w.priority, w.run_after, w.id LIMIT 1) AS n
        UNION ALL
        SELECT n.id, n.scope, n.kind, n.priority, n.is_head
        FROM firsts AS f
        CROSS JOIN LATERAL (
            SELECT w.id, w.scope, w.kind, w.priority, w.is_head FROM work_items AS w
            WHERE w.scope = f.scope AND w.status = 'Queued'
              AND (w.kind, w.priority) > (f.kind, f.priority)
            ORDER BY w.kind, w.priority, w.run_after, w.id LIMIT 1) AS n
    )
    SELECT COALESCE(array_agg(id), '{}'),
           COALESCE(array_agg(id) FILTER (WHERE NOT is_head), '{}'),
           array_agg(scope) FILTER (WHERE NOT is_head),
           array_agg(kind) FILTER (WHERE NOT is_head),
           array_agg(priority) FILTER (WHERE NOT is_head)
    INTO wanted, missing, missing_scopes, missing_kinds, missing_priorities
    FROM firsts;
    IF cardinality(missing) > 0 THEN
        WITH made AS (
            UPDATE work_items SET is_head = true
            WHERE id IN (SELECT id FROM work_items
                         WHERE id = ANY(missing) AND status = 'Queued'
                         FOR UPDATE SKIP LOCKED)
            RETURNING id
        )
        SELECT COALESCE(array_agg(id), '{}') FROM made INTO made_ids;
    END IF;
    promoted := cardinality(made_ids);
    unsettled := '{}';
    -- Held by another transaction: the line's next unheld item stands in.
    FOR line IN
        SELECT m.scope, m.kind, m.priority
        FROM unnest(missing, missing_scopes, missing_kinds, missing_priorities)
             AS m (id, scope, kind, priority)
        WHERE m.id <> ALL(made_ids)
    LOOP
        unsettled := unsettled || line.scope;
        UPDATE work_items SET is_head = true
        WHERE id = (SELECT id FROM work_items
                    WHERE scope = line.scope AND kind = line.kind
                      AND priority = line.priority AND status = 'Queued'
                    ORDER BY run_after, id LIMIT 1 FOR UPDATE SKIP LOCKED)
        RETURNING id INTO stand_in;
        IF stand_in IS NOT NULL THEN
            wanted := wanted || stand_in;
            promoted := promoted + 1;
        END IF;
    END LOOP;
    unsettled := ARRAY(SELECT DISTINCT u FROM unnest(unsettled) AS u);
    -- Every other head of those scopes steps down.
    UPDATE work_items SET is_head = false
    WHERE id IN (SELECT id FROM work_items
                 WHERE scope = ANY(p_scopes) AND status = 'Queued' AND is_head
                   AND id <> ALL(wanted)
                 FOR UPDATE SKIP LOCKED);
    PERFORM pg_notify('trioworker', d.scope)
    FROM (SELECT DISTINCT scope FROM work_items
          WHERE id = ANY(wanted) AND is_head AND run_after <= now()) AS d;
END
$$;

-- work_settle_locked for one scope: whether it was settled in full.
CREATE FUNCTION work_settle_scope(p_scope text, OUT promoted integer, OUT settled boolean)
LANGUAGE sql AS $$
    SELECT s.promoted, cardinality(s.unsettled) = 0 FROM work_settle_locked(ARRAY[p_scope]) AS s
$$;

-- Settle each of `p_scopes` (taking their settle locks in a fixed order); a scope
-- whose lock stays taken, or that could not be settled in full, is noted for a later
-- settle.
CREATE FUNCTION work_settle_scopes(p_scopes text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    s text;
    locked text[] := '{}';
    result record;
BEGIN
    FOR s IN
        SELECT x FROM (SELECT DISTINCT x FROM unnest(p_scopes) AS x WHERE x IS NOT NULL) AS d
        ORDER BY hashtext(x), x
    LOOP
        IF work_lock_scope(s) THEN
            locked := locked || s;
        ELSE
            INSERT INTO work_unsettled_scopes (scope) VALUES (s);
            PERFORM pg_notify('trioworker_settle', s);
        END IF;
    END LOOP;
    IF cardinality(locked) = 0 THEN
        RETURN 0;
    END IF;
    result := work_settle_locked(locked);
    FOREACH s IN ARRAY result.unsettled LOOP
        INSERT INTO work_unsettled_scopes (scope) VALUES (s);
        PERFORM pg_notify('trioworker_settle', s);
    END LOOP;
    RETURN result.promoted;
END
$$;

-- -- the claim ---------------------------------------------------------------------

-- Claim up to `p_limit` due items of `p_kinds` for `p_worker`, never two of one scope,
-- in one statement:
--
-- * the candidates: heads of free scopes and unscoped items of the served kinds that
--   are not paused, from every scope (p_scopes NULL) or only the listed ones, best
--   first (priority DESC, run_after, id) and at most one per scope. Each (kind,
--   priority) level is read in run_after order from the heads and unscoped indexes,
--   the levels found by a skip scan, so neither a busy scope's backlog nor other
--   kinds' work is ever walked; rows a concurrent claim holds are skipped as the
--   levels are read (FOR UPDATE SKIP LOCKED), so concurrent claims take different
--   items rather than the same ones;
-- * claims of one scope take turns on its claim lock (try only: a scope another claim
--   is taking is passed over);
-- * the candidates, locked as they were read, become Running. The heads of a claimed
--   scope's other lines stay until the scope is settled when its item ends; claims
--   pass over them with one index probe each (NOT EXISTS), so a busy scope costs a
--   claim at most one probe per line, never one per item waiting in it.
--
-- A claim can still meet a Running item of its scope that its snapshot could not see
-- (one set by hand, or a claim that committed a moment before this one took the
-- lock): work_items_one_running_per_scope then rejects the statement, and the caller
-- recognises the loss by the index's name. The store then claims again at once, and
-- that claim sees the other item and takes the batch's other items.
CREATE FUNCTION work_claim(
    p_worker text, p_lease double precision, p_limit integer, p_kinds text[],
    p_scopes text[] DEFAULT NULL, p_unscoped boolean DEFAULT true
) RETURNS SETOF work_items
LANGUAGE plpgsql
-- Planned once per session: planning this statement costs more than running it, and
-- so would JIT-compiling it (a generic plan's estimate can pass jit_above_cost).
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
AS $$
DECLARE
    was text := current_setting('trioworker.internal', true);
BEGIN
    PERFORM set_config('trioworker.internal', 'on', true);
    RETURN QUERY
    WITH RECURSIVE
    kinds AS (
        SELECT DISTINCT k AS kind FROM unnest(p_kinds) AS k
        WHERE NOT EXISTS (SELECT 1 FROM work_pauses AS p WHERE p.kind = k)
    ),
    levels AS (
        -- Each kind's priority levels, highest first (over every scope's heads and the
        -- unscoped items, or over the unscoped items alone for a list of scopes).
        SELECT k.kind,
               GREATEST((SELECT max(h.priority) FROM work_items AS h
                         WHERE p_scopes IS NULL AND h.kind = k.kind
                           AND h.status = 'Queued' AND h.is_head),
                        (SELECT max(u.priority) FROM work_items AS u
                         WHERE p_unscoped AND u.kind = k.kind AND u.status = 'Queued'
                           AND u.scope IS NULL)) AS priority
        FROM kinds AS k
        UNION ALL
        SELECT l.kind,
               GREATEST((SELECT max(h.priority) FROM work_items AS h
                         WHERE p_scopes IS NULL AND h.kind = l.kind
                           AND h.status = 'Queued' AND h.is_head AND h.priority < l.priority),
                        (SELECT max(u.priority) FROM work_items AS u
                         WHERE p_unscoped AND u.kind = l.kind AND u.status = 'Queued'
                           AND u.scope IS NULL AND u.priority < l.priority))
        FROM levels AS l WHERE l.priority IS NOT NULL
    ),
    due AS (
        SELECT c.* FROM levels AS l
        CROSS JOIN LATERAL (
            SELECT h.id, h.scope, h.priority, h.run_after FROM work_items AS h
            WHERE p_scopes IS NULL AND h.kind = l.kind AND h.priority = l.priority
              AND h.status = 'Queued' AND h.is_head AND h.run_after <= now()
              AND NOT EXISTS (SELECT 1 FROM work_items AS r
                              WHERE r.scope = h.scope AND r.status = 'Running')
            ORDER BY h.run_after, h.id
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED) AS c
        WHERE l.priority IS NOT NULL
        UNION ALL
        SELECT c.* FROM levels AS l
        CROSS JOIN LATERAL (
            SELECT u.id, u.scope, u.priority, u.run_after FROM work_items AS u
            WHERE p_unscoped AND u.kind = l.kind AND u.priority = l.priority
              AND u.status = 'Queued' AND u.scope IS NULL AND u.run_after <= now()
            ORDER BY u.run_after, u.id
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED) AS c
        WHERE l.priority IS NOT NULL
        UNION ALL
        SELECT c.* FROM unnest(p_scopes) AS s (scope)
        CROSS JOIN LATERAL (
            SELECT h.id, h.scope, h.priority, h.run_after FROM work_items AS h
            WHERE h.scope = s.scope AND h.status = 'Queued' AND h.is_head
              AND h.kind IN (SELECT kind FROM kinds) AND h.run_after <= now()
              AND NOT EXISTS (SELECT 1 FROM work_items AS r
                              WHERE r.scope = h.scope AND r.status = 'Running')
            ORDER BY h.priority DESC, h.run_after, h.id
            LIMIT 1
            FOR UPDATE SKIP LOCKED) AS c
    ),
    candidates AS (
        SELECT d.id, d.scope FROM (
            SELECT DISTINCT ON (COALESCE(d.scope, d.id::text)) d.*
            FROM due AS d
            WHERE d.scope IS NULL
               OR NOT EXISTS (SELECT 1 FROM work_pauses AS p WHERE p.scope = d.scope)
            ORDER BY COALESCE(d.scope, d.id::text), d.priority DESC, d.run_after, d.id
        ) AS d
        ORDER BY d.priority DESC, d.run_after, d.id
        LIMIT p_limit
    ),
    turn AS (
        SELECT c.id FROM candidates AS c
        WHERE c.scope IS NULL OR pg_try_advisory_xact_lock(29816, hashtext(c.scope))
    ),
    claimed AS (
        -- The candidates are locked already, so they are still as the statement saw
        -- them; they are looked up by primary key, whatever the plan.
        UPDATE work_items AS w
        SET status = 'Running', is_head = false,
            attempt = w.attempt + 1,
            worker_id = p_worker,
            lease_expires_at = now() + make_interval(secs => p_lease),
            heartbeat_at = now(),
            started_at = now()
        WHERE w.id = ANY(ARRAY(SELECT turn.id FROM turn))
        RETURNING w.*
    )
    SELECT * FROM claimed;
    PERFORM set_config('trioworker.internal', COALESCE(was, ''), true);
END
$$;

-- Seconds until the next head or unscoped item of `p_kinds` (those not paused) that is
-- not due yet becomes due (NULL: none), for an idle Worker's sleep.
CREATE FUNCTION work_seconds_until_due(
    p_kinds text[], p_scopes text[] DEFAULT NULL, p_unscoped boolean DEFAULT true
) RETURNS double precision
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
AS $$
DECLARE
    seconds double precision;
BEGIN
    WITH RECURSIVE
    kinds AS (
        SELECT DISTINCT k AS kind FROM unnest(p_kinds) AS k
        WHERE NOT EXISTS (SELECT 1 FROM work_pauses AS p WHERE p.kind = k)
    ),
    levels AS (
        SELECT k.kind, (SELECT max(w.priority) FROM work_items AS w
                        WHERE w.kind = k.kind AND w.status = 'Queued'
                          AND (w.is_head OR w.scope IS NULL)) AS priority
        FROM kinds AS k
        UNION ALL
        SELECT l.kind, (SELECT max(w.priority) FROM work_items AS w
                        WHERE w.kind = l.kind AND w.status = 'Queued'
                          AND (w.is_head OR w.scope IS NULL) AND w.priority < l.priority)
        FROM levels AS l WHERE l.priority IS NOT NULL
    )
    SELECT EXTRACT(EPOCH FROM min(n.run_after) - now())::float8 INTO seconds
    FROM levels AS l
    CROSS JOIN LATERAL (
        (SELECT h.run_after FROM work_items AS h
         WHERE h.kind = l.kind AND h.priority = l.priority AND h.status = 'Queued'
           AND h.is_head AND h.run_after > now()
           AND (p_scopes IS NULL OR h.scope = ANY(p_scopes))
         ORDER BY h.run_after LIMIT 1)
        UNION ALL
        (SELECT u.run_after FROM work_items AS u
         WHERE p_unscoped AND u.kind = l.kind AND u.priority = l.priority
           AND u.status = 'Queued' AND u.scope IS NULL AND u.run_after > now()
         ORDER BY u.run_after LIMIT 1)
    ) AS n
    WHERE l.priority IS NOT NULL;
    RETURN seconds;
END
$$;

-- -- the writes after a claim, fenced by (id, attempt) -------------------------------------

-- End attempts as Succeeded, Failed or Cancelled, and settle their scopes. With
-- p_wait false, a row another transaction holds for more than a moment is passed over
-- (the caller writes it on its own), so one held row never delays the rest of a
-- batch. Returns the ids written.
CREATE FUNCTION work_finish(
    p_ids bigint[], p_attempts integer[], p_status text,
    p_reason text DEFAULT NULL, p_error text DEFAULT NULL, p_wait boolean DEFAULT true,
    p_traceback text DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
DECLARE
    was text := current_setting('trioworker.internal', true);
    was_timeout text := current_setting('lock_timeout');
    done_ids bigint[];
    done_scopes text[];
BEGIN
    PERFORM set_config('trioworker.internal', 'on', true);
    IF p_status NOT IN ('Succeeded', 'Failed', 'Cancelled') THEN
        RAISE EXCEPTION 'work_finish: % is not a final status', p_status;
    END IF;

    BEGIN
        IF NOT p_wait THEN
            PERFORM set_config('lock_timeout', '50ms', true);
        END IF;
        WITH done AS (
            UPDATE work_items AS w
            SET status = p_status, finished_at = now(), lease_expires_at = NULL,
                reason = CASE WHEN p_status = 'Succeeded' THEN w.reason ELSE p_reason END,
                error = CASE WHEN p_status = 'Failed' THEN p_error ELSE w.error END,
                traceback = CASE WHEN p_status = 'Failed' THEN p_traceback ELSE w.traceback END,
                failures = w.failures + (p_status = 'Failed')::integer
            FROM unnest(p_ids, p_attempts) AS d (id, attempt)
            WHERE w.id = d.id AND w.attempt = d.attempt AND w.status = 'Running'
            RETURNING w.id, w.scope
        )
        SELECT array_agg(done.id), array_agg(done.scope) FILTER (WHERE done.scope IS NOT NULL)
        INTO done_ids, done_scopes FROM done;
        PERFORM set_config('lock_timeout', was_timeout, true);
    EXCEPTION WHEN lock_not_available THEN
        -- Another transaction holds one of the rows: write the rest now; the caller
        -- writes that one on its own.
        WITH done AS (
            UPDATE work_items AS w
            SET status = p_status, finished_at = now(), lease_expires_at = NULL,
                reason = CASE WHEN p_status = 'Succeeded' THEN w.reason ELSE p_reason END,
                error = CASE WHEN p_status = 'Failed' THEN p_error ELSE w.error END,
                traceback = CASE WHEN p_status = 'Failed' THEN p_traceback ELSE w.traceback END,
                failures = w.failures + (p_status = 'Failed')::integer
            FROM unnest(p_ids, p_attempts) AS d (id, attempt)
            WHERE w.id = d.id AND w.attempt = d.attempt AND w.status = 'Running'
              AND w.id IN (SELECT l.id FROM work_items AS l
                           WHERE l.id = ANY(p_ids) AND l.status = 'Running'
                           FOR UPDATE SKIP LOCKED)
            RETURNING w.id, w.scope
        )
        SELECT array_agg(done.id), array_agg(done.scope) FILTER (WHERE done.scope IS NOT NULL)
        INTO done_ids, done_scopes FROM done;
    END;
    IF p_status <> 'Succeeded' AND done_ids IS NOT NULL THEN
        -- Its attempt, worker and start are still on the row.
        PERFORM work_note_attempt(d, lower(p_status), p_error, p_traceback)
        FROM unnest(done_ids) AS d;
    END IF;
    IF done_scopes IS NOT NULL THEN
        PERFORM work_settle_scopes(done_scopes);
    END IF;
    PERFORM set_config('trioworker.internal', COALESCE(was, ''), true);
    RETURN QUERY SELECT unnest(done_ids);
END
$$;

-- Note how attempt p_id's current attempt ended (not a success) in work_attempts, and
-- keep the item's last 20 such notes. Call it before the row's attempt fields change.
CREATE FUNCTION work_note_attempt(
    p_id bigint, p_outcome text, p_error text DEFAULT NULL, p_traceback text DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    noted integer;
BEGIN
    INSERT INTO work_attempts (item_id, attempt, worker_id, started_at, outcome, error, traceback)
    SELECT id, attempt, worker_id, started_at, p_outcome, p_error, p_traceback
    FROM work_items WHERE id = p_id
    ON CONFLICT (item_id, attempt) DO NOTHING
    RETURNING attempt INTO noted;
    IF noted > 20 THEN
        DELETE FROM work_attempts WHERE item_id = p_id AND attempt <= noted - 20;
    END IF;
END
$$;

-- Back to Queued at the item's place in line (after p_delay seconds for a retry).
CREATE FUNCTION work_requeue_update(
    p_id bigint, p_cause text, p_delay double precision, p_error text, p_traceback text
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE work_items
    SET status = 'Queued', is_head = false, worker_id = NULL,
        lease_expires_at = NULL, reason = NULL,
        run_after = CASE WHEN p_cause = 'retry'
                         THEN now() + make_interval(secs => p_delay)
                         ELSE run_after END,
        error = COALESCE(p_error, error),
        traceback = COALESCE(p_traceback, traceback),
        failures = failures + (p_cause = 'retry')::integer,
        stalls = stalls + (p_cause = 'stall')::integer
    WHERE id = p_id;
END
$$;

-- The one way back to Queued: a release (no failure), a retry after a handler error
-- (one failure more, due again after p_delay seconds), or a stall found by lease
-- recovery (one stall more). An item whose dedup key another Queued item holds is
-- superseded by it instead (it ends Cancelled), so a requeue never wedges on the dedup
-- index. Takes the locked Running row; does not settle its scope (callers do).
-- Returns the status the item ended in, or 'Running' when a sibling with its dedup
-- key is being enqueued right now (try again).
CREATE FUNCTION work_requeue_row(
    p_id bigint, p_cause text, p_delay double precision, p_error text,
    p_traceback text DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    key text;
    sibling bigint;
    was_timeout text := current_setting('lock_timeout');
BEGIN
    IF p_cause NOT IN ('release', 'retry', 'stall') THEN
        RAISE EXCEPTION 'work_requeue_row: unknown cause %', p_cause;
    END IF;
    PERFORM work_note_attempt(
        p_id, CASE p_cause WHEN 'retry' THEN 'retried' WHEN 'release' THEN 'released'
                           ELSE 'stalled' END,
        COALESCE(p_error, CASE WHEN p_cause = 'stall' THEN 'lease expired' END), p_traceback);
    SELECT dedup_key INTO key FROM work_items WHERE id = p_id;
    IF key IS NOT NULL THEN
        SELECT q.id INTO sibling FROM work_items AS q
        WHERE q.dedup_key = key AND q.status = 'Queued' AND q.id <> p_id;
    END IF;
    IF key IS NULL THEN
        PERFORM work_requeue_update(p_id, p_cause, p_delay, p_error, p_traceback);
        RETURN 'Queued';
    ELSIF sibling IS NULL THEN
        BEGIN
            -- An uncommitted sibling makes the dedup index wait for its commit.
            PERFORM set_config('lock_timeout', '200ms', true);
            PERFORM work_requeue_update(p_id, p_cause, p_delay, p_error, p_traceback);
            PERFORM set_config('lock_timeout', was_timeout, true);
            RETURN 'Queued';
        EXCEPTION
            WHEN unique_violation THEN
                SELECT q.id INTO sibling FROM work_items AS q
                WHERE q.dedup_key = key AND q.status = 'Queued' AND q.id <> p_id;
                IF sibling IS NULL THEN
                    RAISE;
                END IF;
            WHEN lock_not_available THEN
                RETURN 'Running';
        END;
    END IF;
    UPDATE work_items
    SET status = 'Cancelled', is_head = false, worker_id = NULL, lease_expires_at = NULL,
        finished_at = now(), reason = 'superseded by queued item ' || sibling,
        error = COALESCE(p_error, error), traceback = COALESCE(p_traceback, traceback),
        failures = failures + (p_cause = 'retry')::integer,
        stalls = stalls + (p_cause = 'stall')::integer
    WHERE id = p_id;
    RETURN 'Cancelled';
END
$$;

-- Release attempts (p_cause 'release') or retry them after an error ('retry'):
-- fenced by (id, attempt). Returns the status each written item ended in.
CREATE FUNCTION work_requeue(
    p_ids bigint[], p_attempts integer[], p_cause text,
    p_delay double precision DEFAULT 0, p_error text DEFAULT NULL,
    p_traceback text DEFAULT NULL
) RETURNS TABLE (id bigint, status text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
#variable_conflict use_column
DECLARE
    was text := current_setting('trioworker.internal', true);
    r record;
    ended text;
    scopes text[] := '{}';
BEGIN
    PERFORM set_config('trioworker.internal', 'on', true);
    IF p_cause NOT IN ('release', 'retry') THEN
        RAISE EXCEPTION 'work_requeue: cause must be release or retry, not %', p_cause;
    END IF;
    FOR r IN
        SELECT w.id, w.scope, w.run_after FROM work_items AS w
        JOIN unnest(p_ids, p_attempts) AS d (id, attempt)
          ON w.id = d.id AND w.attempt = d.attempt
        WHERE w.status = 'Running'
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
    PERFORM set_config('trioworker.internal', COALESCE(was, ''), true);
END
$$;

-- Lease recovery: Running items whose lease expired count a stall and go back to
-- Queued (work_requeue_row), or fail as stalled at p_max_stalls, or end Cancelled when
-- their cancel was requested. Rows another transaction holds are left for next time.
CREATE FUNCTION work_recover(p_max_stalls integer, p_batch integer)
RETURNS TABLE (
    id bigint, kind text, scope text, attempt integer, stalls integer,
    status text, reason text
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
#variable_conflict use_column
DECLARE
    was text := current_setting('trioworker.internal', true);
    r record;
    ended text;
    scopes text[] := '{}';
BEGIN
    PERFORM set_config('trioworker.internal', 'on', true);
    FOR r IN
        SELECT w.id, w.kind, w.scope, w.attempt, w.stalls, w.cancel_requested
        FROM work_items AS w
        WHERE w.status = 'Running' AND w.lease_expires_at < now()
        ORDER BY w.lease_expires_at
        LIMIT p_batch
        FOR UPDATE SKIP LOCKED
    LOOP
        IF r.stalls + 1 >= p_max_stalls OR r.cancel_requested THEN
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
    PERFORM set_config('trioworker.internal', COALESCE(was, ''), true);
END
$$;

-- Cancel a Queued item at once, or ask a Running one to stop (its next heartbeat
-- says so). Returns the item's status after it, or NULL if it had already finished
-- or does not exist.
CREATE FUNCTION work_request_cancel(p_id bigint) RETURNS text
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
DECLARE
    was text := current_setting('trioworker.internal', true);
    r record;
BEGIN
    PERFORM set_config('trioworker.internal', 'on', true);
    UPDATE work_items
    SET status = CASE WHEN status = 'Queued' THEN 'Cancelled' ELSE status END,
        finished_at = CASE WHEN status = 'Queued' THEN now() ELSE finished_at END,
        reason = CASE WHEN status = 'Queued' THEN 'cancelled before it ran' ELSE reason END,
        is_head = false,
        cancel_requested = true
    WHERE id = p_id AND status IN ('Queued', 'Running')
    RETURNING status, scope INTO r;
    IF r.status = 'Cancelled' THEN
        PERFORM work_settle_scopes(ARRAY[r.scope]);
    END IF;
    PERFORM set_config('trioworker.internal', COALESCE(was, ''), true);
    RETURN r.status;
END
$$;

-- Settle up to `p_limit` scopes noted in work_unsettled_scopes. Returns how many.
CREATE FUNCTION work_settle_noted(p_limit integer) RETURNS integer
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
DECLARE
    was text := current_setting('trioworker.internal', true);
    s text;
    result record;
    n integer := 0;
BEGIN
    PERFORM set_config('trioworker.internal', 'on', true);
    FOR s IN
        SELECT scope FROM (SELECT DISTINCT scope FROM work_unsettled_scopes LIMIT p_limit) AS u
        ORDER BY hashtext(scope), scope
    LOOP
        CONTINUE WHEN NOT work_lock_scope(s);
        DELETE FROM work_unsettled_scopes WHERE scope = s;
        result := work_settle_scope(s);
        IF NOT result.settled THEN
            INSERT INTO work_unsettled_scopes (scope) VALUES (s);
        END IF;
        n := n + 1;
    END LOOP;
    PERFORM set_config('trioworker.internal', COALESCE(was, ''), true);
    RETURN n;
END
$$;

-- The check that must always find nothing: free scopes, not paused and not waiting
-- to be settled, with a line whose first item is not a head (a wedge). Each one found
-- is settled; returns the scopes repaired. A repair is a bug in the rules above made
-- visible (the Workers log and count it), never a path the queue relies on.
CREATE FUNCTION work_repair(p_limit integer) RETURNS TABLE (scope text, promoted integer)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
#variable_conflict use_column
DECLARE
    was text := current_setting('trioworker.internal', true);
    wedged text;
    result record;
BEGIN
    PERFORM set_config('trioworker.internal', 'on', true);
    FOR wedged IN
        WITH RECURSIVE scopes AS (
            (SELECT w.scope FROM work_items AS w
             WHERE w.status = 'Queued' AND w.scope IS NOT NULL
             ORDER BY w.scope LIMIT 1)
            UNION ALL
            SELECT (SELECT w.scope FROM work_items AS w
                    WHERE w.status = 'Queued' AND w.scope IS NOT NULL AND w.scope > s.scope
                    ORDER BY w.scope LIMIT 1)
            FROM scopes AS s WHERE s.scope IS NOT NULL
        )
        SELECT x.scope FROM scopes AS x
        WHERE x.scope IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM work_items AS r
                          WHERE r.scope = x.scope AND r.status = 'Running')
          AND NOT EXISTS (SELECT 1 FROM work_pauses AS p WHERE p.scope = x.scope)
          AND NOT EXISTS (SELECT 1 FROM work_unsettled_scopes AS u WHERE u.scope = x.scope)
          AND EXISTS (
              WITH RECURSIVE lines AS (
                  (SELECT w.kind, w.priority FROM work_items AS w
                   WHERE w.scope = x.scope AND w.status = 'Queued'
                   ORDER BY w.kind, w.priority LIMIT 1)
                  UNION ALL
                  SELECT n.kind, n.priority FROM lines AS l
                  CROSS JOIN LATERAL (
                      SELECT w.kind, w.priority FROM work_items AS w
                      WHERE w.scope = x.scope AND w.status = 'Queued'
                        AND (w.kind, w.priority) > (l.kind, l.priority)
                      ORDER BY w.kind, w.priority LIMIT 1) AS n
              )
              SELECT 1 FROM lines AS l
              WHERE NOT (SELECT f.is_head FROM work_items AS f
                         WHERE f.scope = x.scope AND f.kind = l.kind
                           AND f.priority = l.priority AND f.status = 'Queued'
                         ORDER BY f.run_after, f.id LIMIT 1))
        LIMIT p_limit
    LOOP
        CONTINUE WHEN NOT work_lock_scope(wedged);
        result := work_settle_scope(wedged);
        IF result.promoted > 0 THEN
            scope := wedged;
            promoted := result.promoted;
            RETURN NEXT;
        END IF;
    END LOOP;
    PERFORM set_config('trioworker.internal', COALESCE(was, ''), true);
END
$$;

-- Pause a kind or a scope (claims pass it over; Running work goes on), or resume it.
CREATE FUNCTION work_pause(p_kind text, p_scope text) RETURNS boolean
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
DECLARE
    was text := current_setting('trioworker.internal', true);
    added boolean;
    lock_wait text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('trioworker.internal', 'on', true);
    INSERT INTO work_pauses (kind, scope) VALUES (p_kind, p_scope) ON CONFLICT DO NOTHING;
    added := FOUND;
    IF p_scope IS NOT NULL THEN
        -- Every claim of the scope holds the head it takes from the moment it reads
        -- it: waiting for the heads (not passing over them, as a settle does) waits
        -- out claims in flight, and a claim that comes to a head after this commits
        -- finds it no longer a head; the settle lock waits out a settle in flight,
        -- and later settles see the pause. So once the pause is committed with its
        -- scope's heads stepped down, no claim can start an item of the scope. A lock
        -- held longer than the bounded wait (a head in someone's own transaction)
        -- leaves a head for the scope's next settle to step down.
        BEGIN
            PERFORM set_config('lock_timeout', '2s', true);
            PERFORM pg_advisory_xact_lock(29815, hashtext(p_scope));
            UPDATE work_items SET is_head = false
            WHERE id IN (SELECT id FROM work_items
                         WHERE scope = p_scope AND status = 'Queued' AND is_head
                         ORDER BY id FOR UPDATE);
            PERFORM set_config('lock_timeout', lock_wait, true);
        EXCEPTION WHEN lock_not_available THEN
            PERFORM set_config('lock_timeout', lock_wait, true);
            INSERT INTO work_unsettled_scopes (scope) VALUES (p_scope);
            PERFORM pg_notify('trioworker_settle', p_scope);
        END;
    END IF;
    PERFORM set_config('trioworker.internal', COALESCE(was, ''), true);
    RETURN added;
END
$$;

CREATE FUNCTION work_resume(p_kind text, p_scope text) RETURNS boolean
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
DECLARE
    was text := current_setting('trioworker.internal', true);
    removed boolean;
BEGIN
    PERFORM set_config('trioworker.internal', 'on', true);
    DELETE FROM work_pauses
    WHERE kind IS NOT DISTINCT FROM p_kind AND scope IS NOT DISTINCT FROM p_scope;
    removed := FOUND;
    IF p_scope IS NOT NULL THEN
        PERFORM work_settle_scopes(ARRAY[p_scope]);
    ELSIF removed THEN
        PERFORM pg_notify('trioworker', '');
    END IF;
    PERFORM set_config('trioworker.internal', COALESCE(was, ''), true);
    RETURN removed;
END
$$;

-- -- the triggers: what others do to work_items, seen without a lock -----------------------

-- An item arrives in a line (inserted, or changed by hand into Queued or into another
-- line or place): it becomes a head unless something certainly goes before it. At
-- READ COMMITTED that is read from the table, confirmed at commit below; at
-- REPEATABLE READ or SERIALIZABLE the snapshot may be older than the commit, and
-- reading would make serializable enqueues conflict, so only a head this transaction
-- itself placed earlier in the same line counts (kept in trioworker.last_head).
CREATE FUNCTION work_items_arrive() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    line text;
    last text[];
BEGIN
    IF NEW.status <> 'Queued' OR NEW.scope IS NULL THEN
        NEW.is_head := false;
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.status = 'Queued'
       AND (OLD.scope, OLD.kind, OLD.priority, OLD.run_after)
           IS NOT DISTINCT FROM (NEW.scope, NEW.kind, NEW.priority, NEW.run_after) THEN
        RETURN NEW;
    END IF;
    IF current_setting('transaction_isolation') = 'read committed' THEN
        NEW.is_head := NOT (
            EXISTS (SELECT 1 FROM work_items
                    WHERE scope = NEW.scope AND status = 'Running' AND id <> NEW.id)
            OR EXISTS (SELECT 1 FROM work_pauses WHERE scope = NEW.scope)
            OR EXISTS (SELECT 1 FROM work_items AS h
                       WHERE h.scope = NEW.scope AND h.status = 'Queued' AND h.is_head
                         AND h.kind = NEW.kind AND h.priority = NEW.priority
                         AND (h.run_after, h.id) < (NEW.run_after, NEW.id)));
    ELSE
        line := md5(quote_literal(NEW.scope) || quote_literal(NEW.kind) || NEW.priority);
        last := string_to_array(current_setting('trioworker.last_head', true), ' ');
        NEW.is_head := NOT COALESCE(
            last[1] = line
            AND (last[2]::double precision, last[3]::bigint)
                <= (EXTRACT(EPOCH FROM NEW.run_after)::double precision, NEW.id),
            false);
        IF NEW.is_head THEN
            PERFORM set_config('trioworker.last_head',
                line || ' ' || EXTRACT(EPOCH FROM NEW.run_after) || ' ' || NEW.id, true);
        END IF;
    END IF;
    IF NEW.is_head AND NEW.run_after <= now() THEN
        PERFORM pg_notify('trioworker', NEW.scope);
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER work_items_arrive
    BEFORE INSERT OR UPDATE OF status, scope, kind, priority, run_after ON work_items
    FOR EACH ROW
    WHEN ((NEW.scope IS NOT NULL OR NEW.is_head)
          AND current_setting('trioworker.internal', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION work_items_arrive();

-- At commit, an item placed behind (at READ COMMITTED) checks that something still
-- goes before it, holding its scope's settle lock shared so that no settle of the
-- scope can start until this transaction has committed (a settle that starts later
-- sees this item). If the lock is taken, or nothing goes before it any more, the item
-- makes itself a head: an extra head is harmless.
CREATE FUNCTION work_items_confirm_place() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    r record;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN NULL;  -- placed behind this transaction's own head only: that holds
    END IF;
    SELECT id, scope, kind, priority, run_after, status, is_head INTO r
    FROM work_items WHERE id = NEW.id;
    IF NOT FOUND OR r.status <> 'Queued' OR r.scope IS NULL OR r.is_head THEN
        RETURN NULL;
    END IF;
    IF pg_try_advisory_xact_lock_shared(29815, hashtext(r.scope)) THEN
        IF current_setting('trioworker.confirmed_busy', true) = md5(r.scope) THEN
            RETURN NULL;  -- checked for an earlier row of this commit, under this lock
        END IF;
        IF EXISTS (SELECT 1 FROM work_items
                   WHERE scope = r.scope AND status = 'Running' AND id <> r.id)
           OR EXISTS (SELECT 1 FROM work_pauses WHERE scope = r.scope) THEN
            PERFORM set_config('trioworker.confirmed_busy', md5(r.scope), true);
            RETURN NULL;
        END IF;
        IF EXISTS (SELECT 1 FROM work_items AS h
                   WHERE h.scope = r.scope AND h.status = 'Queued' AND h.is_head
                     AND h.kind = r.kind AND h.priority = r.priority
                     AND (h.run_after, h.id) < (r.run_after, r.id)) THEN
            RETURN NULL;
        END IF;
    END IF;
    UPDATE work_items SET is_head = true WHERE id = r.id;
    IF r.run_after <= now() THEN
        PERFORM pg_notify('trioworker', r.scope);
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER work_items_confirm_place
    AFTER INSERT OR UPDATE OF status, scope, kind, priority, run_after ON work_items
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.status = 'Queued' AND NEW.scope IS NOT NULL AND NOT NEW.is_head
          AND current_setting('trioworker.internal', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION work_items_confirm_place();

-- A head or a Running item changed or deleted by hand: its scope must be settled
-- again. Noted (an insert, no lock) and announced; a Worker settles it.
CREATE FUNCTION work_items_depart() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO work_unsettled_scopes (scope) VALUES (OLD.scope);
    PERFORM pg_notify('trioworker_settle', OLD.scope);
    RETURN NULL;
END
$$;

CREATE TRIGGER work_items_depart_update
    AFTER UPDATE OF status, scope, kind, priority, run_after ON work_items
    FOR EACH ROW
    WHEN ((OLD.status = 'Running' OR OLD.is_head) AND OLD.scope IS NOT NULL
          AND (OLD.status, OLD.scope, OLD.kind, OLD.priority, OLD.run_after)
              IS DISTINCT FROM (NEW.status, NEW.scope, NEW.kind, NEW.priority, NEW.run_after)
          AND current_setting('trioworker.internal', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION work_items_depart();

CREATE TRIGGER work_items_depart_delete
    AFTER DELETE ON work_items
    FOR EACH ROW
    WHEN ((OLD.status = 'Running' OR OLD.is_head) AND OLD.scope IS NOT NULL
          AND current_setting('trioworker.internal', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION work_items_depart();

-- Wake idle Workers for unscoped items that arrive due (scoped heads notify above).
CREATE FUNCTION work_items_notify_unscoped() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted
               WHERE scope IS NULL AND status = 'Queued' AND run_after <= now()) THEN
        PERFORM pg_notify('trioworker', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER work_items_notify_unscoped
    AFTER INSERT ON work_items
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION work_items_notify_unscoped();

-- A pause added, lifted or changed by hand: settle its scope.
CREATE FUNCTION work_pauses_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s text;
BEGIN
    FOREACH s IN ARRAY ARRAY[CASE WHEN TG_OP <> 'INSERT' THEN OLD.scope END,
                             CASE WHEN TG_OP <> 'DELETE' THEN NEW.scope END] LOOP
        IF s IS NOT NULL THEN
            INSERT INTO work_unsettled_scopes (scope) VALUES (s);
            PERFORM pg_notify('trioworker_settle', s);
        END IF;
    END LOOP;
    PERFORM pg_notify('trioworker', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER work_pauses_changed
    AFTER INSERT OR UPDATE OR DELETE ON work_pauses
    FOR EACH ROW
    WHEN (current_setting('trioworker.internal', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION work_pauses_changed();
