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

-- Put heads where they belong in one scope: none if it is busy or paused, else the
-- first item of each line. Rows other transactions hold are passed over (the next
-- unheld item of the line stands in) and the scope is reported not settled. Call it
-- holding the scope's settle lock. Returns how many items became heads.
CREATE FUNCTION work_settle_scope(p_scope text, OUT promoted integer, OUT settled boolean)
LANGUAGE plpgsql AS $$
DECLARE
    line record;
    head_id bigint;
    n integer;
    due boolean := false;
BEGIN
    promoted := 0;
    settled := true;
    IF EXISTS (SELECT 1 FROM work_items WHERE scope = p_scope AND status = 'Running')
       OR EXISTS (SELECT 1 FROM work_pauses WHERE scope = p_scope) THEN
        UPDATE work_items SET is_head = false
        WHERE id IN (SELECT id FROM work_items
                     WHERE scope = p_scope AND status = 'Queued' AND is_head
                     FOR UPDATE SKIP LOCKED);
        RETURN;
    END IF;
    FOR line IN
        WITH RECURSIVE lines AS (
            (SELECT kind, priority FROM work_items
             WHERE scope = p_scope AND status = 'Queued'
             ORDER BY kind, priority LIMIT 1)
            UNION ALL
            SELECT n.kind, n.priority
            FROM lines AS l
            CROSS JOIN LATERAL (
                SELECT kind, priority FROM work_items
                WHERE scope = p_scope AND status = 'Queued'
                  AND (kind, priority) > (l.kind, l.priority)
                ORDER BY kind, priority LIMIT 1) AS n
        )
        SELECT kind, priority FROM lines
    LOOP
        -- The line's first item, unless another transaction holds it.
        SELECT id INTO head_id FROM work_items
        WHERE scope = p_scope AND kind = line.kind AND priority = line.priority
          AND status = 'Queued'
        ORDER BY run_after, id LIMIT 1;
        PERFORM 1 FROM work_items WHERE id = head_id AND is_head;
        IF NOT FOUND THEN
            UPDATE work_items SET is_head = true
            WHERE id = (SELECT id FROM work_items
                        WHERE id = head_id AND status = 'Queued' FOR UPDATE SKIP LOCKED);
            IF NOT FOUND THEN
                settled := false;
                UPDATE work_items SET is_head = true
                WHERE id = (SELECT id FROM work_items
                            WHERE scope = p_scope AND kind = line.kind
                              AND priority = line.priority AND status = 'Queued'
                            ORDER BY run_after, id LIMIT 1 FOR UPDATE SKIP LOCKED)
                RETURNING id INTO head_id;
            END IF;
            GET DIAGNOSTICS n = ROW_COUNT;
            promoted := promoted + n;
        END IF;
        -- Any other head of the line steps down.
        UPDATE work_items SET is_head = false
        WHERE id IN (SELECT id FROM work_items
                     WHERE scope = p_scope AND status = 'Queued' AND is_head
                       AND kind = line.kind AND priority = line.priority
                       AND id IS DISTINCT FROM head_id
                     FOR UPDATE SKIP LOCKED);
        due := due OR EXISTS (SELECT 1 FROM work_items
                              WHERE id = head_id AND is_head AND run_after <= now());
    END LOOP;
    IF due THEN
        PERFORM pg_notify('trioworker', p_scope);
    END IF;
END
$$;

-- Settle each of `p_scopes` (in the settle locks' fixed order); a scope whose lock
-- stays taken, or that could not be settled in full, is noted for a later settle.
CREATE FUNCTION work_settle_scopes(p_scopes text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    s text;
    result record;
    promoted integer := 0;
BEGIN
    FOR s IN
        SELECT x FROM (SELECT DISTINCT x FROM unnest(p_scopes) AS x WHERE x IS NOT NULL) AS d
        ORDER BY hashtext(x), x
    LOOP
        IF work_lock_scope(s) THEN
            result := work_settle_scope(s);
            promoted := promoted + result.promoted;
            IF result.settled THEN
                CONTINUE;
            END IF;
        END IF;
        INSERT INTO work_unsettled_scopes (scope) VALUES (s);
        PERFORM pg_notify('trioworker_settle', s);
    END LOOP;
    RETURN promoted;
END
$$;

-- Mark the queue's own transitions, so the triggers below leave their rows alone.
-- Returns the previous mark, for work_end_internal.
CREATE FUNCTION work_begin_internal() RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    was text := current_setting('trioworker.internal', true);
BEGIN
    PERFORM set_config('trioworker.internal', 'on', true);
    RETURN was;
END
$$;

CREATE FUNCTION work_end_internal(p_was text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('trioworker.internal', COALESCE(p_was, ''), true);
END
$$;

-- -- the claim ---------------------------------------------------------------------

-- Due candidates for a claim, best first and at most one per scope: heads of free
-- scopes and unscoped items of `p_kinds` (paused kinds and scopes left out), from
-- every scope (p_scopes NULL) or only the listed ones. Each (kind, priority) level is
-- read in run_after order from the heads and unscoped indexes, so neither a busy
-- scope's backlog nor other kinds' work is ever walked.
CREATE FUNCTION work_candidates(
    p_kinds text[], p_scopes text[], p_unscoped boolean, p_limit integer
) RETURNS TABLE (id bigint, scope text)
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE
    kinds AS (
        SELECT DISTINCT k AS kind FROM unnest(p_kinds) AS k
        WHERE NOT EXISTS (SELECT 1 FROM work_pauses AS p WHERE p.kind = k)
    ),
    head_levels AS (
        SELECT k.kind,
               (SELECT max(h.priority) FROM work_items AS h
                WHERE h.kind = k.kind AND h.status = 'Queued' AND h.is_head) AS priority
        FROM kinds AS k
        WHERE p_scopes IS NULL
        UNION ALL
        SELECT l.kind,
               (SELECT max(h.priority) FROM work_items AS h
                WHERE h.kind = l.kind AND h.status = 'Queued' AND h.is_head
                  AND h.priority < l.priority)
        FROM head_levels AS l WHERE l.priority IS NOT NULL
    ),
    unscoped_levels AS (
        SELECT k.kind,
               (SELECT max(u.priority) FROM work_items AS u
                WHERE u.kind = k.kind AND u.status = 'Queued' AND u.scope IS NULL) AS priority
        FROM kinds AS k
        WHERE p_unscoped
        UNION ALL
        SELECT l.kind,
               (SELECT max(u.priority) FROM work_items AS u
                WHERE u.kind = l.kind AND u.status = 'Queued' AND u.scope IS NULL
                  AND u.priority < l.priority)
        FROM unscoped_levels AS l WHERE l.priority IS NOT NULL
    ),
    heads AS (
        SELECT c.* FROM head_levels AS l
        CROSS JOIN LATERAL (
            SELECT h.id, h.scope, h.priority, h.run_after FROM work_items AS h
            WHERE h.kind = l.kind AND h.priority = l.priority
              AND h.status = 'Queued' AND h.is_head AND h.run_after <= now()
              AND NOT EXISTS (SELECT 1 FROM work_items AS r
                              WHERE r.scope = h.scope AND r.status = 'Running')
            ORDER BY h.run_after, h.id
            LIMIT p_limit) AS c
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
            LIMIT 1) AS c
    ),
    unscoped AS (
        SELECT c.* FROM unscoped_levels AS l
        CROSS JOIN LATERAL (
            SELECT u.id, u.scope, u.priority, u.run_after FROM work_items AS u
            WHERE u.kind = l.kind AND u.priority = l.priority
              AND u.status = 'Queued' AND u.scope IS NULL AND u.run_after <= now()
            ORDER BY u.run_after, u.id
            LIMIT p_limit) AS c
        WHERE l.priority IS NOT NULL
    ),
    best_of_each_scope AS (
        SELECT DISTINCT ON (h.scope) h.* FROM heads AS h
        WHERE NOT EXISTS (SELECT 1 FROM work_pauses AS p WHERE p.scope = h.scope)
        ORDER BY h.scope, h.priority DESC, h.run_after, h.id
    )
    SELECT c.id, c.scope FROM (
        SELECT * FROM best_of_each_scope UNION ALL SELECT * FROM unscoped
    ) AS c
    ORDER BY c.priority DESC, c.run_after, c.id
    LIMIT p_limit
$$;

-- Claim up to `p_limit` due items of `p_kinds` for `p_worker`, never two of one scope.
-- Claims of one scope take turns on its claim lock (try only: a scope another claim
-- holds is passed over), and the Running check reads after the lock, so claims never
-- collide with each other. What can still collide is a Running item set by hand and
-- not yet committed: work_items_one_running_per_scope rejects the claim of that scope,
-- recognised by the index's name. That scope comes back as a row with a NULL id (a race
-- loss), and the batch is taken again item by item, so its other items are still
-- claimed. The claimed scope's other heads step down: a busy scope leaves the claim's
-- indexes.
CREATE FUNCTION work_claim(
    p_worker text, p_lease double precision, p_limit integer, p_kinds text[],
    p_scopes text[] DEFAULT NULL, p_unscoped boolean DEFAULT true
) RETURNS TABLE (
    id bigint, kind text, scope text, payload jsonb, priority integer, attempt integer,
    stalls integer, failures integer, requested_at timestamptz, dedup_key text
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    was text := work_begin_internal();
    candidate record;
    ids bigint[] := '{}';
    one bigint;
    claimed work_items[];
    index_name text;
    detail text;
BEGIN
    FOR candidate IN SELECT * FROM work_candidates(p_kinds, p_scopes, p_unscoped, p_limit) LOOP
        IF candidate.scope IS NULL
           OR pg_try_advisory_xact_lock(29816, hashtext(candidate.scope)) THEN
            ids := ids || candidate.id;
        END IF;
    END LOOP;
    IF cardinality(ids) = 0 THEN
        PERFORM work_end_internal(was);
        RETURN;
    END IF;
    BEGIN
        claimed := work_claim_rows(ids, p_worker, p_lease);
    EXCEPTION WHEN unique_violation THEN
        GET STACKED DIAGNOSTICS index_name = CONSTRAINT_NAME, detail = PG_EXCEPTION_DETAIL;
        IF index_name <> 'work_items_one_running_per_scope' THEN
            RAISE;
        END IF;
        -- Once the other Running item committed, the claim can see it: take the batch
        -- item by item, and report the lost scope.
        RETURN QUERY SELECT NULL::bigint, NULL::text,
                            substring(detail FROM '^Key \(scope\)=\((.*)\) already exists'),
                            NULL::jsonb, NULL::integer, NULL::integer, NULL::integer,
                            NULL::integer, NULL::timestamptz, NULL::text;
        claimed := '{}';
        FOREACH one IN ARRAY ids LOOP
            BEGIN
                claimed := claimed || work_claim_rows(ARRAY[one], p_worker, p_lease);
            EXCEPTION WHEN unique_violation THEN
                GET STACKED DIAGNOSTICS index_name = CONSTRAINT_NAME;
                IF index_name <> 'work_items_one_running_per_scope' THEN
                    RAISE;
                END IF;
                RETURN QUERY SELECT NULL::bigint, w.kind, w.scope, NULL::jsonb, w.priority,
                                    NULL::integer, NULL::integer, NULL::integer,
                                    NULL::timestamptz, NULL::text
                             FROM work_items AS w WHERE w.id = one;
            END;
        END LOOP;
    END;
    PERFORM work_end_internal(was);
    RETURN QUERY SELECT c.id, c.kind, c.scope, c.payload, c.priority, c.attempt, c.stalls,
                        c.failures, c.requested_at, c.dedup_key
                 FROM unnest(claimed) AS c;
END
$$;

-- The claim's write: the rows of `p_ids` still claimable become Running; other heads
-- of their scopes step down. Rows other transactions hold are passed over.
CREATE FUNCTION work_claim_rows(p_ids bigint[], p_worker text, p_lease double precision)
RETURNS work_items[]
LANGUAGE sql AS $$
    WITH picked AS (
        SELECT w.id FROM work_items AS w
        WHERE w.id = ANY(p_ids) AND w.status = 'Queued' AND w.run_after <= now()
          AND (w.scope IS NULL OR (w.is_head AND NOT EXISTS (
                SELECT 1 FROM work_items AS r
                WHERE r.scope = w.scope AND r.status = 'Running')))
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE work_items AS w
        SET status = 'Running', is_head = false,
            attempt = w.attempt + 1,
            worker_id = p_worker,
            lease_expires_at = now() + make_interval(secs => p_lease),
            heartbeat_at = now(),
            started_at = now()
        FROM picked WHERE w.id = picked.id
        RETURNING w AS item, w.id, w.scope
    ), stepped_down AS (
        UPDATE work_items AS d SET is_head = false
        WHERE d.id IN (SELECT h.id FROM work_items AS h JOIN claimed AS c ON h.scope = c.scope
                       WHERE h.status = 'Queued' AND h.is_head AND h.id <> c.id
                       FOR UPDATE OF h SKIP LOCKED)
    )
    SELECT COALESCE(array_agg(c.item ORDER BY c.id), '{}') FROM claimed AS c
$$;

-- Seconds until the next head or unscoped item of `p_kinds` that is not due yet
-- becomes due (NULL: none), for an idle Worker's sleep.
CREATE FUNCTION work_seconds_until_due(
    p_kinds text[], p_scopes text[] DEFAULT NULL, p_unscoped boolean DEFAULT true
) RETURNS double precision
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE
    kinds AS (SELECT DISTINCT k AS kind FROM unnest(p_kinds) AS k),
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
    SELECT EXTRACT(EPOCH FROM min(n.run_after) - now())::float8
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
    WHERE l.priority IS NOT NULL
$$;

-- -- the writes after a claim, fenced by (id, attempt) -------------------------------------

-- End attempts as Succeeded, Failed or Cancelled, and settle their scopes. With
-- p_wait false, rows another transaction holds are passed over (the caller retries
-- them one by one), so one held row never delays the rest of a batch. Returns the
-- ids written.
CREATE FUNCTION work_finish(
    p_ids bigint[], p_attempts integer[], p_status text,
    p_reason text DEFAULT NULL, p_error text DEFAULT NULL, p_wait boolean DEFAULT true
) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    was text := work_begin_internal();
    done_ids bigint[];
    done_scopes text[];
BEGIN
    IF p_status NOT IN ('Succeeded', 'Failed', 'Cancelled') THEN
        RAISE EXCEPTION 'work_finish: % is not a final status', p_status;
    END IF;
    WITH done AS (
        UPDATE work_items AS w
        SET status = p_status, finished_at = now(), lease_expires_at = NULL,
            reason = CASE WHEN p_status = 'Succeeded' THEN w.reason ELSE p_reason END,
            error = CASE WHEN p_status = 'Failed' THEN p_error ELSE w.error END,
            failures = w.failures + (p_status = 'Failed')::integer
        FROM unnest(p_ids, p_attempts) AS d (id, attempt)
        WHERE w.id = d.id AND w.attempt = d.attempt AND w.status = 'Running'
          AND (p_wait OR w.id IN (SELECT l.id FROM work_items AS l
                                  WHERE l.id = ANY(p_ids) AND l.status = 'Running'
                                  FOR UPDATE SKIP LOCKED))
        RETURNING w.id, w.scope
    )
    SELECT array_agg(done.id), array_agg(done.scope) INTO done_ids, done_scopes FROM done;
    PERFORM work_settle_scopes(done_scopes);
    PERFORM work_end_internal(was);
    RETURN QUERY SELECT unnest(done_ids);
END
$$;

-- Back to Queued at the item's place in line (after p_delay seconds for a retry).
CREATE FUNCTION work_requeue_update(
    p_id bigint, p_cause text, p_delay double precision, p_error text
) RETURNS void
LANGUAGE sql AS $$
    UPDATE work_items
    SET status = 'Queued', is_head = false, worker_id = NULL,
        lease_expires_at = NULL, reason = NULL,
        run_after = CASE WHEN p_cause = 'retry'
                         THEN now() + make_interval(secs => p_delay)
                         ELSE run_after END,
        error = COALESCE(p_error, error),
        failures = failures + (p_cause = 'retry')::integer,
        stalls = stalls + (p_cause = 'stall')::integer
    WHERE id = p_id
$$;

-- The one way back to Queued: a release (no failure), a retry after a handler error
-- (one failure more, due again after p_delay seconds), or a stall found by lease
-- recovery (one stall more). An item whose dedup key another Queued item holds is
-- superseded by it instead (it ends Cancelled), so a requeue never wedges on the dedup
-- index. Takes the locked Running row; does not settle its scope (callers do).
-- Returns the status the item ended in, or 'Running' when a sibling with its dedup
-- key is being enqueued right now (try again).
CREATE FUNCTION work_requeue_row(
    p_id bigint, p_cause text, p_delay double precision, p_error text
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
    SELECT dedup_key INTO key FROM work_items WHERE id = p_id;
    IF key IS NOT NULL THEN
        SELECT q.id INTO sibling FROM work_items AS q
        WHERE q.dedup_key = key AND q.status = 'Queued' AND q.id <> p_id;
    END IF;
    IF key IS NULL THEN
        PERFORM work_requeue_update(p_id, p_cause, p_delay, p_error);
        RETURN 'Queued';
    ELSIF sibling IS NULL THEN
        BEGIN
            -- An uncommitted sibling makes the dedup index wait for its commit.
            PERFORM set_config('lock_timeout', '200ms', true);
            PERFORM work_requeue_update(p_id, p_cause, p_delay, p_error);
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
        error = COALESCE(p_error, error),
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
    p_delay double precision DEFAULT 0, p_error text DEFAULT NULL
) RETURNS TABLE (id bigint, status text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    was text := work_begin_internal();
    r record;
    ended text;
    scopes text[] := '{}';
BEGIN
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
        ended := work_requeue_row(r.id, p_cause, p_delay, p_error);
        id := r.id;
        status := ended;
        RETURN NEXT;
        scopes := scopes || r.scope;
        IF ended = 'Queued' AND r.scope IS NULL AND p_cause = 'release' THEN
            PERFORM pg_notify('trioworker', '');
        END IF;
    END LOOP;
    PERFORM work_settle_scopes(scopes);
    PERFORM work_end_internal(was);
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
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    was text := work_begin_internal();
    r record;
    ended text;
    scopes text[] := '{}';
BEGIN
    FOR r IN
        SELECT w.id, w.kind, w.scope, w.attempt, w.stalls, w.cancel_requested
        FROM work_items AS w
        WHERE w.status = 'Running' AND w.lease_expires_at < now()
        ORDER BY w.lease_expires_at
        LIMIT p_batch
        FOR UPDATE SKIP LOCKED
    LOOP
        IF r.stalls + 1 >= p_max_stalls OR r.cancel_requested THEN
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
    PERFORM work_end_internal(was);
END
$$;

-- Cancel a Queued item at once, or ask a Running one to stop (its next heartbeat
-- says so). Returns the item's status after it, or NULL if it had already finished
-- or does not exist.
CREATE FUNCTION work_request_cancel(p_id bigint) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    was text := work_begin_internal();
    r record;
BEGIN
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
    PERFORM work_end_internal(was);
    RETURN r.status;
END
$$;

-- Settle up to `p_limit` scopes noted in work_unsettled_scopes. Returns how many.
CREATE FUNCTION work_settle_noted(p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    was text := work_begin_internal();
    s text;
    result record;
    n integer := 0;
BEGIN
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
    PERFORM work_end_internal(was);
    RETURN n;
END
$$;

-- The check that must always find nothing: free scopes, not paused and not waiting
-- to be settled, with a line whose first item is not a head (a wedge). Each one found
-- is settled; returns the scopes repaired. A repair is a bug in the rules above made
-- visible (the Workers log and count it), never a path the queue relies on.
CREATE FUNCTION work_repair(p_limit integer) RETURNS TABLE (scope text, promoted integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    was text := work_begin_internal();
    wedged text;
    result record;
BEGIN
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
    PERFORM work_end_internal(was);
END
$$;

-- Pause a kind or a scope (claims pass it over; Running work goes on), or resume it.
CREATE FUNCTION work_pause(p_kind text, p_scope text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    was text := work_begin_internal();
    added boolean;
BEGIN
    INSERT INTO work_pauses (kind, scope) VALUES (p_kind, p_scope) ON CONFLICT DO NOTHING;
    added := FOUND;
    IF p_scope IS NOT NULL THEN
        PERFORM work_settle_scopes(ARRAY[p_scope]);
    END IF;
    PERFORM work_end_internal(was);
    RETURN added;
END
$$;

CREATE FUNCTION work_resume(p_kind text, p_scope text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    was text := work_begin_internal();
    removed boolean;
BEGIN
    DELETE FROM work_pauses
    WHERE kind IS NOT DISTINCT FROM p_kind AND scope IS NOT DISTINCT FROM p_scope;
    removed := FOUND;
    IF p_scope IS NOT NULL THEN
        PERFORM work_settle_scopes(ARRAY[p_scope]);
    ELSIF removed THEN
        PERFORM pg_notify('trioworker', '');
    END IF;
    PERFORM work_end_internal(was);
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
LANGUAGE plpgsql AS $$
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
LANGUAGE plpgsql AS $$
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
