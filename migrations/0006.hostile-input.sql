-- What other programs store cannot take a Worker down (issue 18): a payload's nesting
-- is bounded where every writer meets it, and a claim lock held by someone else costs
-- a claim only that scope, never the rest of its batch.
-- depends: 0005.trace-context

-- No value nested 64 levels deep (trioworker._jsontext.MAX_DEPTH; every Python enqueue
-- path checks the same bound first and names it). Python's json module cannot read
-- back nesting much past its recursion limit, so a deeper payload, valid jsonb and
-- inside the size limit, would be a poison pill for every Worker that claims it. The
-- jsonpath stops at the level it looks for, so a deep payload costs no more to check
-- than a shallow one. NOT VALID, as in 0005: validating would scan the table under
-- this ALTER's exclusive lock; new and updated rows are checked all the same.
ALTER TABLE work_items ADD CONSTRAINT work_items_payload_depth
    CHECK (NOT jsonb_path_exists(payload, 'strict $.**{64}'))
    NOT VALID;
ALTER TABLE work_schedules ADD CONSTRAINT work_schedules_payload_depth
    CHECK (NOT jsonb_path_exists(payload, 'strict $.**{64}'))
    NOT VALID;

-- A kind, scope or dedup key that is only whitespace is refused, as every Python path
-- refuses it (str.strip, whose whitespace is exactly this class: the test compares them
-- character by character). 0001's `<> ''` let ' ' or U+2028 in by plain SQL: an item no
-- Worker could ever serve, since a Registry takes no such kind.
CREATE FUNCTION work_not_blank(p_name text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN p_name ~ '[^\u0009-\u000d\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]';

ALTER TABLE work_items ADD CONSTRAINT work_items_names_not_blank
    CHECK (work_not_blank(kind) AND (scope IS NULL OR work_not_blank(scope))
           AND (dedup_key IS NULL OR work_not_blank(dedup_key)))
    NOT VALID;

-- The claim, as in 0002, but a candidate whose scope's claim lock is taken no longer
-- empties the batch. Before, the batch limit was applied to the candidates and then
-- the try-lock filtered them, so a refused head (a claim of another Worker taking the
-- scope, or anyone at all holding pg_advisory_lock(29816, hashtext(scope)): advisory
-- locks need no privilege) cost the claim its other candidates, the unscoped ones
-- included. Now each round claims what it locked, passes over the refused scopes, and
-- looks further, until the batch is full or a round is refused nothing. The first
-- round reads as many candidates as the batch takes, exactly as before; a further
-- round, needed only after a refusal, reads eight times as many as the one before it
-- (it locks more scopes than it claims, each only until the claim commits), so a
-- claim stays a few rounds long whatever number of scopes is held.
CREATE OR REPLACE FUNCTION work_claim(
    p_worker text, p_lease double precision, p_limit integer, p_kinds text[],
    p_scopes text[] DEFAULT NULL, p_unscoped boolean DEFAULT true
) RETURNS SETOF work_items
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
AS $$
DECLARE
    was text := current_setting('trioworker.internal', true);
    passed text[] := '{}';  -- scopes whose claim lock another transaction holds
    wanted integer := p_limit;  -- items the batch still takes
    window_size integer := p_limit;  -- candidates this round reads
    refused text[];
    got record;  -- (not r: the claim's statement names a table alias r)
BEGIN
    PERFORM set_config('trioworker.internal', 'on', true);
    FOR pass IN 1..5 LOOP
        refused := NULL;
        FOR got IN
            WITH RECURSIVE
            kinds AS (
                SELECT DISTINCT k AS kind FROM unnest(p_kinds) AS k
                WHERE NOT EXISTS (SELECT 1 FROM work_pauses AS p WHERE p.kind = k)
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
                    SELECT h.id, h.scope, h.priority, h.run_after FROM work_items AS h
                    WHERE p_scopes IS NULL AND h.kind = l.kind AND h.priority = l.priority
                      AND h.status = 'Queued' AND h.is_head AND h.run_after <= now()
                      AND h.scope <> ALL(passed)
                      AND NOT EXISTS (SELECT 1 FROM work_items AS r
                                      WHERE r.scope = h.scope AND r.status = 'Running')
                    ORDER BY h.run_after, h.id
                    LIMIT window_size
                    FOR UPDATE SKIP LOCKED) AS c
                WHERE l.priority IS NOT NULL
                UNION ALL
                SELECT c.* FROM levels AS l
                CROSS JOIN LATERAL (
                    SELECT u.id, u.scope, u.priority, u.run_after FROM work_items AS u
                    WHERE p_unscoped AND u.kind = l.kind AND u.priority = l.priority
                      AND u.status = 'Queued' AND u.scope IS NULL AND u.run_after <= now()
                    ORDER BY u.run_after, u.id
                    LIMIT window_size
                    FOR UPDATE SKIP LOCKED) AS c
                WHERE l.priority IS NOT NULL
                UNION ALL
                SELECT c.* FROM unnest(p_scopes) AS s (scope)
                CROSS JOIN LATERAL (
                    SELECT h.id, h.scope, h.priority, h.run_after FROM work_items AS h
                    WHERE h.scope = s.scope AND h.status = 'Queued' AND h.is_head
                      AND h.kind IN (SELECT kind FROM kinds) AND h.run_after <= now()
                      AND h.scope <> ALL(passed)
                      AND NOT EXISTS (SELECT 1 FROM work_items AS r
                                      WHERE r.scope = h.scope AND r.status = 'Running')
                    ORDER BY h.priority DESC, h.run_after, h.id
                    LIMIT 1
                    FOR UPDATE SKIP LOCKED) AS c
            ),
            candidates AS (
                SELECT d.* FROM (
                    SELECT DISTINCT ON (COALESCE(d.scope, d.id::text)) d.*
                    FROM due AS d
                    WHERE d.scope IS NULL
                       OR NOT EXISTS (SELECT 1 FROM work_pauses AS p WHERE p.scope = d.scope)
                    ORDER BY COALESCE(d.scope, d.id::text), d.priority DESC, d.run_after, d.id
                ) AS d
                ORDER BY d.priority DESC, d.run_after, d.id
                LIMIT window_size
            ),
            turn AS (
                -- Claims of one scope take turns on its claim lock (try only).
                SELECT c.id, c.scope, c.priority, c.run_after,
                       c.scope IS NULL OR pg_try_advisory_xact_lock(29816, hashtext(c.scope))
                           AS ours
                FROM candidates AS c
            ),
            chosen AS (
                SELECT t.id FROM turn AS t WHERE t.ours
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
                   (SELECT array_agg(t.scope) FROM turn AS t WHERE NOT t.ours) AS refused
            FROM (SELECT) AS one LEFT JOIN claimed AS c ON true
        LOOP
            refused := got.refused;
            IF (got.item).id IS NOT NULL THEN
                wanted := wanted - 1;
                RETURN NEXT got.item;
            END IF;
        END LOOP;
        EXIT WHEN refused IS NULL OR wanted = 0;
        passed := passed || refused;
        window_size := window_size * 8;
    END LOOP;
    PERFORM set_config('trioworker.internal', COALESCE(was, ''), true);
END
$$;
