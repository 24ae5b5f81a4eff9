-- A kind at its limit no longer cuts a claim short: work_claim_v2 and
-- work_finish_and_claim_v2 (issue 36; found by the lockstep state machine,
-- tests/integration/test_store_state_machine.py).
--
-- work_claim_v1 read a round's candidates across every kind, up to the batch, and only
-- then kept no more of a kind than its running limit and rate let start. Candidates of
-- a kind with room for one could fill the window, so a claim for three, with a kind K
-- at room 1 and three due K items ahead of a due L item, took one K item and came back
-- short: L waited for the next poll, though a short claim is meant to say that nothing
-- more could start. work_claim_v2 applies each kind's room to the candidates
-- themselves, before the window is cut, so the window holds only items that may start.
-- A scope whose first item a kind's room held back (its item of another kind could
-- start) is read again in a next round, which no longer reads the kind that is full.
-- And a round that took an item of a scope whose limit is over one goes round again
-- even when its settle made no new head: the scope's other lines (one per kind and
-- priority) may have heads already, which the old loop left for the next poll.
--
-- The versions stand side by side (ADR 0009): a Worker of an older release still calls
-- work_claim_v1 and work_finish_and_claim_v1, unchanged; this release's call _v2. The
-- pattern of work_secure_transitions() (0003.dependencies) and of docs/grants.sql
-- covers the new claim (post-apply.secure-transitions.sql secures it);
-- work_finish_and_claim_v2 runs as its caller, as _v1 does.
-- depends: 0003.dependencies

CREATE FUNCTION work_claim_v2(
    p_worker text, p_lease double precision, p_limit integer, p_kinds text[],
    p_scopes text[] DEFAULT NULL, p_unscoped boolean DEFAULT true
) RETURNS SETOF work_items
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
AS $$
DECLARE
    was text := work_internal_begin();
    passed text[] := '{}';  -- scopes whose claim lock another transaction holds
    wanted integer := p_limit;  -- items the batch still takes
    window_size integer := p_limit;  -- candidates this round reads
    refused text[];
    got record;  -- (not r: the claim's statement names a table alias r)
    roomy text[] := '{}';  -- claimed scopes whose limit lets more start
    held boolean := false;  -- the round passed a scope's first item over for its kind's room
    took integer := 0;  -- items the round took
    -- The running limit of scopes without one of their own.
    default_running integer := COALESCE((SELECT l.running FROM work_limits AS l
                                         WHERE l.kind IS NULL AND l.scope IS NULL), 1);
    -- Whether any scope may run more than one (else no claimed scope is roomy).
    any_roomy boolean := EXISTS (SELECT FROM work_limits AS l
                                 WHERE l.kind IS NULL AND l.running > 1);
BEGIN
    -- A round takes at most one item a scope. A claimed scope whose limit lets more
    -- start is settled after it, so the next item of the claimed line is a head (unless
    -- the scope is full), and while the batch is not full and a settle made heads, the
    -- claim goes round again: a claim comes back short only when nothing more was due.
    -- These settles never wait for a settle lock: a transaction that finished items
    -- first (work_finish_and_claim_v2) holds theirs, and a second set taken in another
    -- order could wait on a transaction waiting on it. A scope whose lock is taken is
    -- noted for a later settle.
    LOOP
        FOR pass IN 1..5 LOOP
            refused := NULL;
            FOR got IN
                WITH RECURSIVE
                served AS (
                    -- Each kind and how many of it may start now (NULL: no limit; its
                    -- rate slots counted are locked until the claim commits).
                    SELECT s.kind, work_kind_allows(s.kind, p_limit) AS room
                    FROM (SELECT DISTINCT k AS kind FROM unnest(p_kinds) AS k
                          WHERE NOT EXISTS (SELECT 1 FROM work_pauses AS p WHERE p.kind = k)) AS s
                ),
                kinds AS (
                    -- A kind at its running limit, or out of starts in its rate window, is
                    -- not read at all: its backlog costs the claim nothing.
                    SELECT v.kind, v.room FROM served AS v WHERE v.room IS NULL OR v.room > 0
                ),
                levels AS (
                    -- Each kind's priority levels, highest first (over every scope's heads
                    -- and the unscoped items, or the unscoped items alone for a list of
                    -- scopes).
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
                                       AND h.status = 'Queued' AND h.is_head
                                       AND h.priority < l.priority),
                                    (SELECT max(u.priority) FROM work_items AS u
                                     WHERE p_unscoped AND u.kind = l.kind AND u.status = 'Queued'
                                       AND u.scope IS NULL AND u.priority < l.priority))
                    FROM levels AS l WHERE l.priority IS NOT NULL
                ),
                due AS (
                    SELECT c.* FROM levels AS l
                    CROSS JOIN LATERAL (
                        SELECT h.id, h.scope, h.kind, h.priority, h.run_after FROM work_items AS h
                        WHERE p_scopes IS NULL AND h.kind = l.kind AND h.priority = l.priority
                          AND h.status = 'Queued' AND h.is_head AND h.run_after <= now()
                          AND h.scope <> ALL(passed)
                          AND NOT EXISTS (  -- its limit's worth Running already: full
                              SELECT FROM work_items AS r
                              WHERE r.scope = h.scope AND r.scope_slot IS NOT NULL
                              OFFSET COALESCE((SELECT l.running FROM work_limits AS l
                                               WHERE l.scope = h.scope), default_running) - 1)
                          AND NOT EXISTS (  -- its rate spent: not read, so it fills no window
                              SELECT FROM work_limits AS l
                              WHERE l.scope = h.scope AND l.rate IS NOT NULL
                                AND work_rate_room(l.id, l.per, 1) = 0)
                        ORDER BY h.run_after, h.id
                        LIMIT window_size
                        FOR UPDATE SKIP LOCKED) AS c
                    WHERE l.priority IS NOT NULL
                    UNION ALL
                    SELECT c.* FROM levels AS l
                    CROSS JOIN LATERAL (
                        SELECT u.id, u.scope, u.kind, u.priority, u.run_after FROM work_items AS u
                        WHERE p_unscoped AND u.kind = l.kind AND u.priority = l.priority
                          AND u.status = 'Queued' AND u.scope IS NULL AND u.run_after <= now()
                        ORDER BY u.run_after, u.id
                        LIMIT window_size
                        FOR UPDATE SKIP LOCKED) AS c
                    WHERE l.priority IS NOT NULL
                    UNION ALL
                    SELECT c.* FROM unnest(p_scopes) AS s (scope)
                    CROSS JOIN LATERAL (
                        SELECT h.id, h.scope, h.kind, h.priority, h.run_after FROM work_items AS h
                        WHERE h.scope = s.scope AND h.status = 'Queued' AND h.is_head
                          AND h.kind IN (SELECT kind FROM kinds) AND h.run_after <= now()
                          AND h.scope <> ALL(passed)
                          AND NOT EXISTS (  -- its limit's worth Running already: full
                              SELECT FROM work_items AS r
                              WHERE r.scope = h.scope AND r.scope_slot IS NOT NULL
                              OFFSET COALESCE((SELECT l.running FROM work_limits AS l
                                               WHERE l.scope = h.scope), default_running) - 1)
                          AND NOT EXISTS (  -- its rate spent: not read, so it fills no window
                              SELECT FROM work_limits AS l
                              WHERE l.scope = h.scope AND l.rate IS NOT NULL
                                AND work_rate_room(l.id, l.per, 1) = 0)
                        ORDER BY h.priority DESC, h.run_after, h.id
                        LIMIT 1
                        FOR UPDATE SKIP LOCKED) AS c
                ),
                firsts AS (
                    -- At most one a scope, each numbered within its kind.
                    SELECT d.*, k.room,
                           row_number() OVER (PARTITION BY d.kind
                                              ORDER BY d.priority DESC, d.run_after, d.id) AS nth
                    FROM (
                        SELECT DISTINCT ON (COALESCE(d.scope, d.id::text)) d.*
                        FROM due AS d
                        WHERE d.scope IS NULL
                           OR NOT EXISTS (SELECT 1 FROM work_pauses AS p WHERE p.scope = d.scope)
                        ORDER BY COALESCE(d.scope, d.id::text), d.priority DESC, d.run_after, d.id
                    ) AS d
                    JOIN kinds AS k ON k.kind = d.kind
                ),
                candidates AS (
                    -- No more of a kind than its room, before the window is cut, so the
                    -- window holds only items that may start.
                    SELECT f.* FROM firsts AS f
                    WHERE f.room IS NULL OR f.nth <= f.room
                    ORDER BY f.priority DESC, f.run_after, f.id
                    LIMIT window_size
                ),
                turn AS (
                    -- Claims of one scope take turns on its claim lock (try only): the row
                    -- of work_claim_locks for its stripe, held until the claim commits.
                    SELECT c.id, c.scope, c.kind, c.priority, c.run_after,
                           c.scope IS NULL OR EXISTS (SELECT FROM work_claim_locks AS l
                                                      WHERE l.stripe = work_stripe(c.scope)
                                                      FOR UPDATE SKIP LOCKED) AS ours
                    FROM candidates AS c
                ),
                chosen AS (
                    -- No more of a kind than its limits let start.
                    SELECT t.id FROM (
                        SELECT t.*, row_number() OVER (PARTITION BY t.kind
                                                       ORDER BY t.priority DESC, t.run_after, t.id)
                                    AS nth
                        FROM turn AS t WHERE t.ours) AS t
                    JOIN kinds AS k ON k.kind = t.kind
                    WHERE k.room IS NULL OR t.nth <= k.room
                    ORDER BY t.priority DESC, t.run_after, t.id
                    LIMIT wanted
                ),
                claimed AS (
                    -- The candidates are locked already, so they are still as the statement
                    -- saw them; they are looked up by primary key, whatever the plan.
                    UPDATE work_items AS w
                    SET status = 'Running', is_head = false,
                        attempt = w.attempt + 1,
                        worker_id = p_worker,
                        lease_expires_at = now() + make_interval(secs => p_lease),
                        heartbeat_at = now(),
                        started_at = now()
                    WHERE w.id = ANY(ARRAY(SELECT chosen.id FROM chosen))
                    RETURNING w
                )
                SELECT c.w AS item,
                       (SELECT array_agg(t.scope) FROM turn AS t WHERE NOT t.ours) AS refused,
                       EXISTS (SELECT FROM firsts AS f WHERE f.scope IS NOT NULL AND f.nth > f.room)
                           AS held
                FROM (SELECT) AS one LEFT JOIN claimed AS c ON true
            LOOP
                refused := got.refused;
                held := held OR got.held;
                IF (got.item).id IS NOT NULL THEN
                    wanted := wanted - 1;
                    took := took + 1;
                    IF any_roomy AND (got.item).scope IS NOT NULL
                       AND work_scope_running_limit((got.item).scope) > 1 THEN
                        roomy := roomy || (got.item).scope;
                    END IF;
                    RETURN NEXT got.item;
                END IF;
            END LOOP;
            EXIT WHEN refused IS NULL OR wanted = 0;
            passed := passed || refused;
            window_size := window_size * 8;
        END LOOP;
        IF cardinality(roomy) > 0 THEN
            PERFORM work_settle_scopes(roomy, false);
        END IF;
        -- Again while the batch is not full and the round took items, if it took one of
        -- a scope that may run more (the settle gave its claimed line a next head, and
        -- its other lines may have heads already), or if a kind's room held a scope's
        -- first item back (the next round does not read the kind, which is full, so the
        -- scope's item of another kind goes): a claim comes back short only when
        -- nothing more could start.
        EXIT WHEN wanted = 0 OR took = 0 OR (cardinality(roomy) = 0 AND NOT held);
        roomy := '{}';
        passed := '{}';
        window_size := wanted;
        held := false;
        took := 0;
    END LOOP;
    PERFORM work_internal_end(was);
END
$$;


-- work_finish_and_claim_v1 with work_claim_v2's claim: the finish of work_finish_v1
-- (Succeeded, rows another transaction holds passed over), then the claim, which sees
-- the items just finished as finished. Runs as its caller (SECURITY INVOKER), as _v1.
CREATE FUNCTION work_finish_and_claim_v2(
    p_ids bigint[], p_attempts integer[], p_worker text, p_lease double precision,
    p_limit integer, p_kinds text[], p_scopes text[] DEFAULT NULL,
    p_unscoped boolean DEFAULT true
) RETURNS TABLE (finished bigint, item work_items)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT f, NULL::work_items
                 FROM work_finish_v1(p_ids, p_attempts, 'Succeeded', NULL, NULL, false, NULL)
                      AS f;
    RETURN QUERY SELECT NULL::bigint, c
                 FROM work_claim_v2(p_worker, p_lease, p_limit, p_kinds, p_scopes, p_unscoped)
                      AS c;
END
$$;
