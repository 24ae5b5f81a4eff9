-- The queue's locks are its own (issue 32, docs/design/claim.md "Locks").
--
-- Advisory locks are one key space for the whole database, and taking one needs no
-- privilege: any role that can connect (PUBLIC has CONNECT) could hold the keys the
-- queue used, and so stop every claim (the limits lock (29817, 0), which every claim
-- waited for), keep a scope's items from ever running (its claim lock (29816,
-- hashtext(scope)), which a claim passed over), or keep a scope from being settled (its
-- settle lock (29815, hashtext(scope))). The queue now locks rows of two tables of its
-- own instead: locking a row takes UPDATE on its table (SELECT ... FOR UPDATE or FOR
-- SHARE asks for it), which a role without the queue's grants does not have.
--
-- * work_settle_locks: a scope's settle lock is the row of its stripe (work_stripe), a
--   settle's FOR UPDATE (bounded wait, as before), an enqueue's check at commit FOR
--   SHARE SKIP LOCKED (try only, as before).
-- * work_claim_locks: a scope's claim lock is the row of its stripe, which a claim takes
--   FOR UPDATE SKIP LOCKED (try only, as before) and holds until it commits.
-- * The limits lock is gone: a change of a scope's running limit (or the default) waits
--   at commit for the claim locks of the scopes it covers (FOR UPDATE, every stripe for
--   the default), which every claim in flight holds for the scopes it takes. So a claim
--   that read the old limit has committed before the scopes to settle are read, as the
--   limits lock made sure; a claim that comes later passes over those scopes until the
--   change has committed, and never waits. Settles need no such lock: a settle reads the
--   limits under its scope's settle lock, and the settle of each scope a change notes
--   waits for that lock (docs/design/limits.md, "Changing a limit while work runs").
--
-- Stripes, not a row per scope: the rows exist before any scope does, so no enqueue
-- writes one (an enqueue that inserted a scope's row would wait for, and could deadlock
-- with, another enqueue of the same scope). Two scopes of one stripe share its locks:
-- their settles take turns, and a claim passes over a scope whose stripe another claim
-- holds, as it passed over a scope another claim was taking. 16,384 stripes keep that
-- rare.
--
-- The functions that took advisory locks are replaced in place, entry points too: a
-- Worker of the earlier release, calling work_claim_v2, must take the same locks as
-- the new ones, or their claims would not exclude each other.
--
-- Lease recovery (docs/design/claim.md, "Lease recovery and a held row") takes an
-- expired row FOR NO KEY UPDATE, the lock its UPDATE takes anyway, so a foreign key's
-- share lock on the row (an application's table that references work_items, in a
-- transaction of its own) no longer makes recovery pass the item over; and
-- work_held_leases_v1 names the expired items it still cannot take a whole lease later.
-- depends: 0007.completed

-- The stripe of a scope's locks: 0 .. 16383.
CREATE FUNCTION work_stripe(p_scope text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN hashtext(p_scope) & 16383;

-- One row per stripe, only ever locked: a row changed or removed would leave the
-- scopes of its stripe no lock to take (a claim would pass them over for good), so
-- the schema refuses it by name, whoever asks.
CREATE TABLE work_settle_locks (
    stripe integer PRIMARY KEY CHECK (stripe BETWEEN 0 AND 16383)
);
INSERT INTO work_settle_locks (stripe) SELECT g FROM generate_series(0, 16383) AS g;

CREATE TABLE work_claim_locks (
    stripe integer PRIMARY KEY CHECK (stripe BETWEEN 0 AND 16383)
);
INSERT INTO work_claim_locks (stripe) SELECT g FROM generate_series(0, 16383) AS g;

CREATE FUNCTION work_lock_rows_stay() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'check_violation', CONSTRAINT = TG_TABLE_NAME || '_stay',
        MESSAGE = format('the rows of %s are the queue''s locks: never changed or removed',
                         TG_TABLE_NAME),
        TABLE = TG_TABLE_NAME;
END
$$;

CREATE TRIGGER work_settle_locks_stay BEFORE UPDATE OR DELETE OR TRUNCATE ON work_settle_locks
    FOR EACH STATEMENT EXECUTE FUNCTION work_lock_rows_stay();
CREATE TRIGGER work_claim_locks_stay BEFORE UPDATE OR DELETE OR TRUNCATE ON work_claim_locks
    FOR EACH STATEMENT EXECUTE FUNCTION work_lock_rows_stay();

-- -- the settle lock ---------------------------------------------------------------------

-- The settle lock of a scope: at once if free, else after a bounded wait (an enqueue
-- holds it shared only while it commits; another settle of its stripe, until it
-- commits). False: it stayed taken, and the caller leaves the scope in
-- work_unsettled_scopes for a later settle.
CREATE OR REPLACE FUNCTION work_lock_scope(p_scope text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    was text := current_setting('lock_timeout');
BEGIN
    PERFORM 1 FROM work_settle_locks WHERE stripe = work_stripe(p_scope)
    FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        RETURN true;
    END IF;
    BEGIN
        PERFORM set_config('lock_timeout', '100ms', true);
        PERFORM 1 FROM work_settle_locks WHERE stripe = work_stripe(p_scope) FOR UPDATE;
        PERFORM set_config('lock_timeout', was, true);
        RETURN true;
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
END
$$;

-- Settle each of `p_scopes` (taking their settle locks in a fixed order: by stripe); a
-- scope whose lock stays taken, or that could not be settled in full, is noted for a
-- later settle.
CREATE OR REPLACE FUNCTION work_settle_scopes(p_scopes text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    s text;
    locked text[] := '{}';
    result record;
BEGIN
    FOR s IN
        SELECT x FROM (SELECT DISTINCT x FROM unnest(p_scopes) AS x WHERE x IS NOT NULL) AS d
        ORDER BY work_stripe(x), x
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

-- Settle up to `p_limit` scopes noted in work_unsettled_scopes. Returns how many.
CREATE OR REPLACE FUNCTION work_settle_noted_v1(p_limit integer) RETURNS integer
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
DECLARE
    was text := work_internal_begin();
    s text;
    result record;
    n integer := 0;
BEGIN
    FOR s IN
        SELECT scope FROM (SELECT DISTINCT scope FROM work_unsettled_scopes LIMIT p_limit) AS u
        ORDER BY work_stripe(scope), scope
    LOOP
        CONTINUE WHEN NOT work_lock_scope(s);
        DELETE FROM work_unsettled_scopes WHERE scope = s;
        result := work_settle_scope(s);
        IF NOT result.settled THEN
            INSERT INTO work_unsettled_scopes (scope) VALUES (s);
        END IF;
        n := n + 1;
    END LOOP;
    PERFORM work_internal_end(was);
    RETURN n;
END
$$;

-- work_settle_locked as migration 0002 left it, without the limits lock (see above).
CREATE OR REPLACE FUNCTION work_settle_locked(
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
    -- The first item of each line of each scope with room (not full, not paused), and those of them not heads yet:
    -- a skip scan over each scope's lines, each step landing on the next line's first.
    WITH RECURSIVE
    free AS (
        SELECT f.scope FROM unnest(p_scopes) AS f (scope)
        WHERE NOT work_scope_full(f.scope)
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
-- An item placed behind at READ COMMITTED, at its commit: as before, with the scope's
-- settle lock shared (try only) now the row of its stripe. This trigger runs as the
-- role whose transaction enqueued, so that role locks the row: FOR SHARE asks for
-- UPDATE on work_settle_locks.
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

-- Pause a kind or a scope (claims pass it over; Running work goes on): as before, with
-- the scope's settle lock now the row of its stripe.
CREATE OR REPLACE FUNCTION work_pause_v1(p_kind text, p_scope text) RETURNS boolean
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
DECLARE
    was text := work_internal_begin();
    added boolean;
    lock_wait text := current_setting('lock_timeout');
BEGIN
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
            PERFORM 1 FROM work_settle_locks WHERE stripe = work_stripe(p_scope) FOR UPDATE;
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
    PERFORM work_internal_end(was);
    RETURN added;
END
$$;

-- -- limits, changed ---------------------------------------------------------------------

-- A scope's running limit (or the default) changed: the scopes it covers are settled
-- again, since a raised limit gives a busy scope heads. At commit, once every claim in
-- flight that may have read the old limit has ended: each holds the claim lock of
-- every scope it takes until it commits, and this takes those locks (the changed
-- scope's, or every stripe for the default) in stripe order, waiting for them. So a
-- claim that read the old limit has committed before the scopes to settle are read,
-- and a claim after it passes over those scopes (try only) until this commits, then
-- reads the new limit. Settles need nothing here: each reads the limits under its
-- scope's settle lock, which the settle of every scope noted below waits for. Like
-- confirm_place, this runs as the role that changed the limit, at its commit.
CREATE OR REPLACE FUNCTION work_limits_settle() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s text;
    any_default boolean := (TG_OP <> 'INSERT' AND OLD.kind IS NULL AND OLD.scope IS NULL)
                           OR (TG_OP <> 'DELETE' AND NEW.kind IS NULL AND NEW.scope IS NULL);
BEGIN
    IF (TG_OP = 'INSERT' OR OLD.kind IS NOT NULL) AND (TG_OP = 'DELETE' OR NEW.kind IS NOT NULL)
    THEN
        RETURN NULL;  -- a kind's limit: no heads change
    END IF;
    PERFORM 1 FROM work_claim_locks AS l
    WHERE any_default
       OR l.stripe IN (work_stripe(CASE WHEN TG_OP <> 'INSERT' THEN OLD.scope END),
                       work_stripe(CASE WHEN TG_OP <> 'DELETE' THEN NEW.scope END))
    ORDER BY l.stripe
    FOR UPDATE;
    FOR s IN
        SELECT x.scope FROM (SELECT CASE WHEN TG_OP <> 'INSERT' THEN OLD.scope END AS scope
                             UNION SELECT CASE WHEN TG_OP <> 'DELETE' THEN NEW.scope END) AS x
        WHERE x.scope IS NOT NULL
        UNION
        -- The default covers every scope without a running limit of its own; those
        -- whose heads it changes are the busy ones.
        SELECT DISTINCT r.scope FROM work_items AS r
        WHERE any_default AND r.status = 'Running' AND r.scope IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM work_limits AS l
                          WHERE l.scope = r.scope AND l.running IS NOT NULL)
    LOOP
        INSERT INTO work_unsettled_scopes (scope) VALUES (s);
        PERFORM pg_notify('trioworker_settle', s);
    END LOOP;
    RETURN NULL;
END
$$;

-- -- the claim -----------------------------------------------------------------------------

-- work_claim_v2 as migration 0002 left it, with its claim locks now rows of
-- work_claim_locks and without the limits lock (see above).
CREATE OR REPLACE FUNCTION work_claim_v2(
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
BEGIN
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
                      AND NOT work_scope_full(h.scope)
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
                      AND NOT work_scope_full(h.scope)
                    ORDER BY h.priority DESC, h.run_after, h.id
                    LIMIT 1
                    FOR UPDATE SKIP LOCKED) AS c
            ),
            candidates AS (
                SELECT d.* FROM (
                    SELECT DISTINCT ON (COALESCE(d.scope, d.id::text)) d.*
                    FROM due AS d
                    WHERE d.scope IS NULL
                       OR (NOT EXISTS (SELECT 1 FROM work_pauses AS p WHERE p.scope = d.scope)
                           AND work_scope_rate_open(d.scope))
                    ORDER BY COALESCE(d.scope, d.id::text), d.priority DESC, d.run_after, d.id
                ) AS d
                ORDER BY d.priority DESC, d.run_after, d.id
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
                   (SELECT array_agg(t.scope) FROM turn AS t WHERE NOT t.ours) AS refused
            FROM (SELECT) AS one LEFT JOIN claimed AS c ON true
        LOOP
            refused := got.refused;
            IF (got.item).id IS NOT NULL THEN
                wanted := wanted - 1;
                IF (got.item).scope IS NOT NULL
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
        -- A scope that may run more than one: the next item of the claimed line
        -- becomes a head now (unless the scope is full), not when this one ends.
        PERFORM work_settle_scopes(roomy);
    END IF;
    PERFORM work_internal_end(was);
END
$$;
-- -- lease recovery --------------------------------------------------------------------------

-- work_recover_v1 and _v2 as they were, taking the expired rows FOR NO KEY UPDATE (the
-- lock their UPDATE takes) rather than FOR UPDATE, which a foreign key's share lock on
-- the row (FOR KEY SHARE) would refuse: only a transaction that holds the row itself,
-- to change it, makes recovery pass an item over (docs/design/claim.md).

CREATE OR REPLACE FUNCTION work_recover_v1(p_max_stalls integer, p_batch integer)
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
        SELECT w.id, w.kind, w.scope, w.attempt, w.stalls, w.cancel_requested
        FROM work_items AS w
        WHERE w.status = 'Running' AND w.lease_expires_at < now()
        ORDER BY w.lease_expires_at
        LIMIT p_batch
        FOR NO KEY UPDATE SKIP LOCKED
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
    PERFORM work_internal_end(was);
END
$$;
CREATE OR REPLACE FUNCTION work_recover_v2(p_max_stalls integer, p_batch integer)
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
        FOR NO KEY UPDATE SKIP LOCKED
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
-- -- leases nobody can take back -----------------------------------------------------------

-- Expired items whose row another transaction still holds a whole lease after their
-- lease ran out (two leases after their last heartbeat), the oldest first. Recovery
-- passes over a held row and takes it the first pass after it is let go; by then every
-- holder the queue knows of has let go (an attempt's fenced transaction ends by its
-- self-stop, half a lease after its last heartbeat; the server ends a vanished host's
-- session within the bound docs/reliability.md states), so this is a session nobody
-- ends: an operator's open transaction, say. The Workers report each (trioworker's
-- log), naming the backend that holds it as the row's xmax says (NULL when several
-- share the lock), so that someone ends it. It ends nothing itself and waits on
-- nothing: it tries each row as recovery does, holding those it could lock (which
-- recovery takes anyway) until its own transaction ends.
CREATE FUNCTION work_held_leases_v1(p_limit integer)
RETURNS TABLE (
    id bigint, kind text, scope text, attempt integer, worker_id text,
    expired_for double precision, holder integer
)
LANGUAGE sql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
AS $$
    WITH overdue AS (
        SELECT w.id FROM work_items AS w
        WHERE w.status = 'Running' AND w.lease_expires_at < now()
          AND w.lease_expires_at
              < now() - GREATEST(w.lease_expires_at - w.heartbeat_at, interval '0')
        ORDER BY w.lease_expires_at
        LIMIT p_limit
    ),
    free AS (
        SELECT w.id FROM work_items AS w
        WHERE w.id IN (SELECT o.id FROM overdue AS o)
        FOR NO KEY UPDATE SKIP LOCKED
    )
    SELECT w.id, w.kind, w.scope, w.attempt, w.worker_id,
           EXTRACT(EPOCH FROM now() - w.lease_expires_at)::float8,
           (SELECT l.pid FROM pg_locks AS l
            WHERE l.locktype = 'transactionid' AND l.transactionid = w.xmax
              AND l.mode = 'ExclusiveLock' AND l.granted)
    FROM work_items AS w
    WHERE w.id IN (SELECT o.id FROM overdue AS o)
      AND w.id NOT IN (SELECT f.id FROM free AS f)
    ORDER BY w.lease_expires_at, w.id
$$;
