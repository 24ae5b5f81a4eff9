-- A scope whose rate is spent gives up its heads until its window reopens, as a busy or
-- paused scope does: a claim no longer reads it (issue 32, `bench hol` shape h).
--
-- Before, such a scope kept its heads (a rate window reopens with time, and no
-- transition runs then), so every claim read them in order and asked each one's rate:
-- about 6 us a spent scope ahead of the first item that may start, 7.3x a near-empty
-- queue's claim behind 1,000 of them. Now a settle that finds a scope spent notes when
-- its window reopens (work_spent_scopes) and leaves it no head; an item arriving in it
-- is placed behind, as in a paused scope; and work_claim_v3 first settles the scopes
-- whose window has reopened, so they take their turn again from that moment. A head
-- that a race leaves in a spent scope (a settle that ran while a claim held the slot it
-- then took) is harmless: the claim still asks each head's rate (work_claim_v2), and
-- the scope's next settle steps it down.
--
-- Changed in place (ADR 0009: the schema's own helpers and triggers, where every
-- caller's behaviour allows it): work_settle_locked, work_items_arrive and
-- work_items_confirm_place. New versions beside the old (a Worker of an older release
-- calls those, unchanged): work_claim_v3 and work_finish_and_claim_v3 (the reopened
-- scopes settled, then the claim of _v2), work_seconds_until_due_v2 (an idle Worker
-- also wakes when a spent scope with Queued work reopens), work_repair_v2 (a spent
-- scope is no wedge). An older Worker never settles a reopened scope itself: its
-- repair pass (work_repair_v1, every quarter lease) finds the scope free with a line
-- whose first item is no head, settles it and logs a repair. The roles that may read
-- work_pauses, or call the earlier claim and repair, get the same on the new table and
-- functions here, so enqueues and new Workers go on before docs/grants.sql is run again.
-- depends: 0004.claim-kind-room

-- Scopes whose rate window is spent, and when it next has a start. Written only by a
-- settle (work_settle_locked, under the scope's settle lock). Read by the triggers that
-- place an arriving item, the claim's pass over reopened scopes, and an idle Worker's
-- sleep.
CREATE TABLE work_spent_scopes (
    scope      text        PRIMARY KEY,
    reopens_at timestamptz NOT NULL,
    CONSTRAINT work_spent_scopes_times_in_range
        CHECK (reopens_at BETWEEN '1900-01-01 00:00:00+00' AND '9000-01-01 00:00:00+00')
);
-- An enqueue's trigger (work_items_arrive) reads it as the enqueuing role, as it reads
-- work_pauses: every role that may read work_pauses may read this, from the moment it
-- exists (docs/grants.sql says the same, for when it is run again).
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT a.grantee FROM pg_catalog.pg_class AS c
        CROSS JOIN LATERAL aclexplode(c.relacl) AS a
        WHERE c.oid = 'work_pauses'::regclass AND a.privilege_type = 'SELECT'
          AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT SELECT ON TABLE work_spent_scopes TO %s',
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC'
                            ELSE quote_ident(pg_catalog.pg_get_userbyid(r.grantee)) END);
    END LOOP;
END
$$;
-- The claim's pass over reopened scopes (reopens_at <= now()), oldest first.
CREATE INDEX work_spent_scopes_reopens ON work_spent_scopes (reopens_at);

-- work_settle_locked (0001.queue, section 4), a scope whose rate is spent now counted
-- with the busy and paused: no heads, and its window's reopening noted.
CREATE OR REPLACE FUNCTION work_settle_locked(
    p_scopes text[], OUT promoted integer, OUT unsettled text[]
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
AS $$
DECLARE
    default_running integer := COALESCE((SELECT l.running FROM work_limits AS l
                                         WHERE l.kind IS NULL AND l.scope IS NULL), 1);
    stepped_down integer;
    announced_scopes integer;
    missed_scopes text[];
    missed_kinds text[];
    missed_priorities integer[];
    missed record;
    stand_in timestamptz;
BEGIN
    unsettled := '{}';
    WITH RECURSIVE
    open AS (
        -- Neither full nor paused; `reopens`: when its spent rate window next has a
        -- start (NULL: it has a start now, or no rate).
        SELECT f.scope, o.reopens
        FROM (SELECT DISTINCT x FROM unnest(p_scopes) AS x) AS f (scope)
        LEFT JOIN LATERAL (
            SELECT s.started_at + l.per AS reopens FROM work_limits AS l
            CROSS JOIN LATERAL (SELECT s.started_at FROM work_rate_slots AS s
                                WHERE s.limit_id = l.id
                                ORDER BY s.started_at LIMIT 1) AS s
            WHERE l.scope = f.scope AND l.rate IS NOT NULL
              AND s.started_at + l.per > now()) AS o ON true
        WHERE NOT EXISTS (  -- its limit's worth Running already: full
                  SELECT FROM work_items AS r
                  WHERE r.scope = f.scope AND r.scope_slot IS NOT NULL
                  OFFSET COALESCE((SELECT l.running FROM work_limits AS l
                                   WHERE l.scope = f.scope), default_running) - 1)
          AND NOT EXISTS (SELECT FROM work_pauses AS p WHERE p.scope = f.scope)
    ),
    free AS (
        SELECT o.scope FROM open AS o WHERE o.reopens IS NULL
    ),
    spent AS (
        -- A spent scope gives up its heads until its window reopens (a claim then
        -- settles it: work_settle_reopened).
        INSERT INTO work_spent_scopes AS s (scope, reopens_at)
        SELECT o.scope, o.reopens FROM open AS o WHERE o.reopens IS NOT NULL
        ON CONFLICT (scope) DO UPDATE SET reopens_at = excluded.reopens_at
        RETURNING s.scope
    ),
    unspent AS (
        -- The note of a scope no longer spent: free now, or its reopening passed (a
        -- full or paused scope is noted again by the settle that frees it, if spent).
        DELETE FROM work_spent_scopes AS s
        WHERE s.scope = ANY(p_scopes)
          AND s.scope <> ALL(ARRAY(SELECT o.scope FROM open AS o WHERE o.reopens IS NOT NULL))
          AND (s.reopens_at <= now() OR s.scope = ANY(ARRAY(SELECT f.scope FROM free AS f)))
        RETURNING s.scope
    ),
    firsts AS (
        -- A skip scan over each scope's lines, each step landing on the next line's first.
        SELECT n.* FROM free AS f
        CROSS JOIN LATERAL (
            SELECT w.id, w.scope, w.kind, w.priority, w.run_after, w.is_head
            FROM work_items AS w
            WHERE w.scope = f.scope AND w.status = 'Queued'
            ORDER BY w.kind, w.priority, w.run_after, w.id LIMIT 1) AS n
        UNION ALL
        SELECT n.* FROM firsts AS f
        CROSS JOIN LATERAL (
            SELECT w.id, w.scope, w.kind, w.priority, w.run_after, w.is_head
            FROM work_items AS w
            WHERE w.scope = f.scope AND w.status = 'Queued'
              AND (w.kind, w.priority) > (f.kind, f.priority)
            ORDER BY w.kind, w.priority, w.run_after, w.id LIMIT 1) AS n
    ),
    -- Rows are looked up by primary key from arrays (ARRAY(...), not IN (...)): a
    -- generic plan joins an IN list by scanning the whole table.
    made AS (
        UPDATE work_items SET is_head = true
        WHERE id = ANY(ARRAY(SELECT w.id FROM work_items AS w
                             WHERE w.id = ANY(ARRAY(SELECT f.id FROM firsts AS f
                                                    WHERE NOT f.is_head))
                               AND w.status = 'Queued'
                             FOR UPDATE SKIP LOCKED))
        RETURNING id
    ),
    stepped AS (
        UPDATE work_items SET is_head = false
        WHERE id = ANY(ARRAY(SELECT w.id FROM work_items AS w
                             WHERE w.scope = ANY(p_scopes) AND w.status = 'Queued'
                               AND w.is_head
                               AND w.id <> ALL(ARRAY(SELECT f.id FROM firsts AS f))
                             FOR UPDATE SKIP LOCKED))
        RETURNING id
    ),
    announced AS (
        SELECT count(pg_notify('trioworker', d.scope)) AS scopes
        FROM (SELECT DISTINCT f.scope FROM firsts AS f
              WHERE f.run_after <= now()
                AND (f.is_head OR f.id = ANY(ARRAY(SELECT m.id FROM made AS m)))) AS d
    )
    SELECT (SELECT count(*) FROM made), (SELECT count(*) FROM stepped),
           (SELECT a.scopes FROM announced AS a),
           array_agg(f.scope), array_agg(f.kind), array_agg(f.priority)
    INTO promoted, stepped_down, announced_scopes, missed_scopes, missed_kinds, missed_priorities
    FROM firsts AS f
    WHERE NOT f.is_head AND f.id <> ALL(ARRAY(SELECT m.id FROM made AS m));
    -- Firsts another transaction holds: the line's next unheld item stands in.
    FOR missed IN
        SELECT m.scope, m.kind, m.priority
        FROM unnest(missed_scopes, missed_kinds, missed_priorities) AS m (scope, kind, priority)
    LOOP
        unsettled := unsettled || missed.scope;
        UPDATE work_items SET is_head = true
        WHERE id = (SELECT w.id FROM work_items AS w
                    WHERE w.scope = missed.scope AND w.kind = missed.kind
                      AND w.priority = missed.priority AND w.status = 'Queued'
                    ORDER BY w.run_after, w.id LIMIT 1 FOR UPDATE SKIP LOCKED)
        RETURNING run_after INTO stand_in;
        IF FOUND THEN
            promoted := promoted + 1;
            IF stand_in <= now() THEN
                PERFORM pg_notify('trioworker', missed.scope);
            END IF;
        END IF;
    END LOOP;
    unsettled := ARRAY(SELECT DISTINCT u FROM unnest(unsettled) AS u);
END
$$;

-- An item arriving in a spent scope is placed behind, as in a paused one (0001.queue,
-- section 6; the settle at the window's reopening makes the heads).
CREATE OR REPLACE FUNCTION work_items_arrive() RETURNS trigger
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
            work_scope_full(NEW.scope, NEW.id)
            OR EXISTS (SELECT 1 FROM work_pauses WHERE scope = NEW.scope)
            OR EXISTS (SELECT 1 FROM work_spent_scopes
                       WHERE scope = NEW.scope AND reopens_at > now())
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

CREATE OR REPLACE FUNCTION work_items_confirm_place() RETURNS trigger
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
    PERFORM 1 FROM work_settle_locks WHERE stripe = work_stripe(r.scope)
    FOR SHARE SKIP LOCKED;
    IF FOUND THEN
        IF current_setting('trioworker.confirmed_busy', true) = md5(r.scope) THEN
            RETURN NULL;  -- checked for an earlier row of this commit, under this lock
        END IF;
        IF work_scope_full(r.scope, r.id)
           OR EXISTS (SELECT 1 FROM work_pauses WHERE scope = r.scope)
           OR EXISTS (SELECT 1 FROM work_spent_scopes
                      WHERE scope = r.scope AND reopens_at > now()) THEN
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

-- Settle the scopes (at most `p_limit`, the longest overdue first) whose rate window
-- has reopened, each noted by the settle that found it spent. Only a settle writes or
-- removes a note (work_settle_locked, under the scope's settle lock), so nothing waits
-- on a note's row. The settle locks are tried, never waited for: a scope whose lock
-- another transaction holds is noted for the Workers' settle pass (once), which waits
-- for it, and is tried again by later claims, after the scopes not noted so. Returns how
-- many items became heads.
CREATE FUNCTION work_settle_reopened(p_limit integer) RETURNS integer
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
AS $$
DECLARE
    was text := work_internal_begin();
    s text;
    locked text[] := '{}';
    result record;
BEGIN
    FOR s IN
        SELECT d.scope FROM (
            SELECT n.scope FROM work_spent_scopes AS n
            WHERE n.reopens_at <= now()
            ORDER BY EXISTS (SELECT FROM work_unsettled_scopes AS u WHERE u.scope = n.scope),
                     n.reopens_at
            LIMIT p_limit) AS d
        ORDER BY work_stripe(d.scope), d.scope
    LOOP
        IF work_lock_scope(s, false) THEN
            locked := locked || s;
        ELSIF NOT EXISTS (SELECT FROM work_unsettled_scopes AS u WHERE u.scope = s) THEN
            INSERT INTO work_unsettled_scopes (scope) VALUES (s);
            PERFORM pg_notify('trioworker_settle', s);
        END IF;
    END LOOP;
    IF cardinality(locked) = 0 THEN
        PERFORM work_internal_end(was);
        RETURN 0;
    END IF;
    result := work_settle_locked(locked);
    FOREACH s IN ARRAY result.unsettled LOOP
        INSERT INTO work_unsettled_scopes (scope) VALUES (s);
        PERFORM pg_notify('trioworker_settle', s);
    END LOOP;
    PERFORM work_internal_end(was);
    RETURN result.promoted;
END
$$;

-- work_claim_v2, after settling the scopes whose rate window has reopened (at most 64
-- a claim), so their items are heads again when this claim reads them.
CREATE FUNCTION work_claim_v3(
    p_worker text, p_lease double precision, p_limit integer, p_kinds text[],
    p_scopes text[] DEFAULT NULL, p_unscoped boolean DEFAULT true
) RETURNS SETOF work_items
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM work_spent_scopes AS s WHERE s.reopens_at <= now()) THEN
        PERFORM work_settle_reopened(64);
    END IF;
    RETURN QUERY SELECT * FROM work_claim_v2(p_worker, p_lease, p_limit, p_kinds, p_scopes,
                                             p_unscoped);
END
$$;

-- work_finish_and_claim_v2 with work_claim_v3's claim. Runs as its caller, as _v2.
CREATE FUNCTION work_finish_and_claim_v3(
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
                 FROM work_claim_v3(p_worker, p_lease, p_limit, p_kinds, p_scopes, p_unscoped)
                      AS c;
END
$$;

-- work_seconds_until_due_v1, or sooner: until a spent scope with Queued work of
-- `p_kinds` (in `p_scopes`, if given) reopens, due or not (the claim then settles it,
-- and its heads' due times count from there on). A note whose reopening has passed is
-- not counted, as v1 counts no rate window already open: the claim before this call
-- settled it, or handed it to the settle pass, which wakes the Workers.
CREATE FUNCTION work_seconds_until_due_v2(
    p_kinds text[], p_scopes text[] DEFAULT NULL, p_unscoped boolean DEFAULT true
) RETURNS double precision
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
AS $$
BEGIN
    RETURN LEAST(
        work_seconds_until_due_v1(p_kinds, p_scopes, p_unscoped),
        (SELECT EXTRACT(EPOCH FROM min(s.reopens_at) - now())::float8
         FROM work_spent_scopes AS s
         WHERE (p_scopes IS NULL OR s.scope = ANY(p_scopes)) AND s.reopens_at > now()
           AND EXISTS (SELECT 1 FROM work_items AS w
                       WHERE w.scope = s.scope AND w.status = 'Queued'
                         AND w.kind = ANY(p_kinds))));
END
$$;

-- work_repair_v1, with a spent scope not taken for a wedge: it has no heads on purpose,
-- and the first claim after its window reopens settles it (work_settle_reopened). A
-- note that no longer holds (the scope has a start open before its note is due) is no
-- excuse: such a scope is settled and reported.
CREATE FUNCTION work_repair_v2(p_limit integer) RETURNS TABLE (scope text, promoted integer)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
#variable_conflict use_column
DECLARE
    was text := work_internal_begin();
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
          AND NOT work_scope_full(x.scope)
          AND NOT EXISTS (SELECT 1 FROM work_pauses AS p WHERE p.scope = x.scope)
          AND NOT EXISTS (SELECT 1 FROM work_unsettled_scopes AS u WHERE u.scope = x.scope)
          AND NOT EXISTS (  -- spent and noted: the first claim after it reopens settles it
              SELECT 1 FROM work_spent_scopes AS s
              WHERE s.scope = x.scope
                AND (s.reopens_at <= now()
                     OR EXISTS (SELECT 1 FROM work_limits AS l
                                WHERE l.scope = x.scope AND l.rate IS NOT NULL
                                  AND NOT EXISTS (SELECT 1 FROM work_rate_slots AS o
                                                  WHERE o.limit_id = l.id
                                                    AND o.started_at <= now() - l.per))))
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
    PERFORM work_internal_end(was);
END
$$;

-- Whoever may call a transition's earlier version may call its new one, from the
-- moment it exists (docs/grants.sql gives the same when it is run again): a Worker of
-- this release starts before an operator runs it.
DO $$
DECLARE
    pair record;
    r record;
BEGIN
    FOR pair IN
        SELECT v.earlier::regprocedure AS earlier, v.later::regprocedure AS later
        FROM (VALUES
            ('work_claim_v2(text, double precision, integer, text[], text[], boolean)',
             'work_claim_v3(text, double precision, integer, text[], text[], boolean)'),
            ('work_repair_v1(integer)', 'work_repair_v2(integer)')) AS v (earlier, later)
    LOOP
        FOR r IN
            SELECT DISTINCT a.grantee FROM pg_catalog.pg_proc AS p
            CROSS JOIN LATERAL aclexplode(p.proacl) AS a
            WHERE p.oid = pair.earlier AND a.privilege_type = 'EXECUTE'
              AND a.grantee <> p.proowner
        LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', pair.later,
                           CASE WHEN r.grantee = 0 THEN 'PUBLIC'
                                ELSE quote_ident(pg_catalog.pg_get_userbyid(r.grantee)) END);
        END LOOP;
    END LOOP;
END
$$;
