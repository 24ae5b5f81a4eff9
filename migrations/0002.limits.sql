-- Limits beyond one (issue 21, docs/design/limits.md): at most N Running items per
-- scope (default 1, the founding rule unchanged) and per kind across every Worker, and
-- at most R starts per period per kind or scope. Held by the schema where a row becomes
-- Running, not by the claim's code alone:
--
-- * every Running item of a scope holds a slot, 1..N, and a unique index over Running
--   rows on (scope, scope_slot) replaces the one on (scope): for N = 1 it is the same
--   rule, and a claim racing for the last slot loses by the index's name;
-- * an item of a kind with a running limit holds a kind slot, the same way;
-- * work_items_take_slot (a BEFORE trigger on every write that makes a row Running, the
--   queue's own or anyone's) gives the lowest free slot, refuses a start over the
--   limit (work_items_slot_within_limit: a limit lowered while work runs), and takes a
--   rate slot (work_items_rate_within_limit when none is open);
-- * a rate of R per period is R rows of work_rate_slots, each the time of one start:
--   a start takes a row whose start is at least a period old, so no window of one
--   period holds more than R starts (two starts in one row are a period apart).
-- depends: 0001.baseline

-- A limit for a kind, for a scope, or (neither) the default running limit of every
-- scope that has no running limit of its own. Plain SQL may write it; trioworker's
-- way is work_set_limit_v1.
CREATE TABLE work_limits (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind       text,
    scope      text,
    -- At most this many Running at once (NULL: no running limit of its own).
    running    integer,
    -- At most `rate` starts in any window of `per` (both NULL: no rate limit).
    rate       integer,
    per        interval,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT work_limits_one_target CHECK (kind IS NULL OR scope IS NULL),
    CONSTRAINT work_limits_names_sane
        CHECK ((kind IS NULL OR (kind <> '' AND length(kind) <= 200 AND work_not_blank(kind)))
               AND (scope IS NULL
                    OR (scope <> '' AND length(scope) <= 200 AND work_not_blank(scope)))),
    CONSTRAINT work_limits_running_sane CHECK (running BETWEEN 1 AND 10000),
    CONSTRAINT work_limits_rate_sane
        CHECK ((rate IS NULL) = (per IS NULL) AND rate BETWEEN 1 AND 10000
               AND per > interval '0' AND per <= interval '1 day'),
    CONSTRAINT work_limits_something CHECK (running IS NOT NULL OR rate IS NOT NULL),
    -- The default row holds a running limit only (a rate is for a named kind or scope).
    CONSTRAINT work_limits_default_running_only
        CHECK (kind IS NOT NULL OR scope IS NOT NULL OR rate IS NULL)
);

CREATE UNIQUE INDEX work_limits_kind ON work_limits (kind) WHERE kind IS NOT NULL;
CREATE UNIQUE INDEX work_limits_scope ON work_limits (scope) WHERE scope IS NOT NULL;
CREATE UNIQUE INDEX work_limits_default ON work_limits ((true))
    WHERE kind IS NULL AND scope IS NULL;

-- A rate limit's windows: one row per start it allows in a period, holding the time of
-- the last start that used it ('-infinity': never used). Kept by work_limits_changed.
CREATE TABLE work_rate_slots (
    limit_id   bigint      NOT NULL REFERENCES work_limits (id) ON DELETE CASCADE,
    slot       integer     NOT NULL,
    started_at timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (limit_id, slot)
);

CREATE INDEX work_rate_slots_oldest ON work_rate_slots (limit_id, started_at);

-- The slots Running items hold (NULL while not Running; a kind slot only for a kind
-- with a running limit).
ALTER TABLE work_items ADD COLUMN scope_slot integer, ADD COLUMN kind_slot integer;
ALTER TABLE work_items ADD CONSTRAINT work_items_slots_only_running
    CHECK (status = 'Running' OR (scope_slot IS NULL AND kind_slot IS NULL));
UPDATE work_items SET scope_slot = 1 WHERE status = 'Running' AND scope IS NOT NULL;

-- The rule as a schema invariant: each slot of a scope held by one Running item at
-- most, and (work_items_take_slot) never a slot past the scope's limit.
CREATE UNIQUE INDEX work_items_one_running_per_scope_slot
    ON work_items (scope, scope_slot) WHERE status = 'Running' AND scope IS NOT NULL;
DROP INDEX work_items_one_running_per_scope;

-- The same for kinds; it also counts a kind's Running items (a NULL slot, Running
-- before the kind had a limit, is counted and never collides).
CREATE UNIQUE INDEX work_items_one_running_per_kind_slot
    ON work_items (kind, kind_slot) WHERE status = 'Running';

-- -- limits, read ------------------------------------------------------------------------

-- The running limit of a scope: its own, else the default row's, else 1.
CREATE FUNCTION work_scope_running_limit(p_scope text) RETURNS integer
LANGUAGE sql STABLE
RETURN COALESCE((SELECT l.running FROM work_limits AS l WHERE l.scope = p_scope),
                (SELECT l.running FROM work_limits AS l
                 WHERE l.kind IS NULL AND l.scope IS NULL),
                1);

-- Whether `p_scope` has as many Running items as its limit allows (not counting item
-- `p_except`, one being changed by hand).
CREATE FUNCTION work_scope_full(p_scope text, p_except bigint DEFAULT NULL) RETURNS boolean
LANGUAGE sql STABLE
RETURN (SELECT count(*) FROM (
            SELECT 1 FROM work_items AS r
            WHERE r.scope = p_scope AND r.status = 'Running'
              AND r.id IS DISTINCT FROM p_except
            LIMIT work_scope_running_limit(p_scope)) AS held)
       >= work_scope_running_limit(p_scope);

-- How many more items of `p_kind` may start now by its running limit (NULL: it has
-- none).
CREATE FUNCTION work_kind_room(p_kind text) RETURNS integer
LANGUAGE sql STABLE
RETURN (SELECT GREATEST(l.running - (SELECT count(*) FROM work_items AS r
                                     WHERE r.kind = p_kind AND r.status = 'Running'), 0)
        FROM work_limits AS l WHERE l.kind = p_kind AND l.running IS NOT NULL);

-- How many starts a rate limit allows now, up to `p_want`. The
-- open rate slots counted are locked (SKIP LOCKED: another claim's are not counted),
-- so the starts this transaction makes find them. Volatile: it locks.
CREATE FUNCTION work_rate_room(p_limit_id bigint, p_per interval, p_want integer)
RETURNS integer
LANGUAGE sql VOLATILE
RETURN (SELECT count(*) FROM (
            SELECT 1 FROM work_rate_slots AS s
            WHERE s.limit_id = p_limit_id AND s.started_at <= now() - p_per
            ORDER BY s.started_at LIMIT p_want
            FOR UPDATE SKIP LOCKED) AS open)::integer;

-- How many more items of `p_kind` a claim may start now, up to `p_want`, by its
-- running limit and its rate (NULL: no limit; 0: none).
CREATE FUNCTION work_kind_allows(p_kind text, p_want integer) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    lim work_limits;
    room integer;
BEGIN
    SELECT * INTO lim FROM work_limits WHERE kind = p_kind;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF lim.running IS NOT NULL THEN
        room := work_kind_room(p_kind);
    END IF;
    IF lim.rate IS NOT NULL AND COALESCE(room, 1) > 0 THEN
        room := work_rate_room(lim.id, lim.per, LEAST(room, p_want));
    END IF;
    RETURN room;
END
$$;

-- Whether a scope's rate allows a start now (true without a rate limit); locks the
-- open rate slot it found, as work_rate_room does.
CREATE FUNCTION work_scope_rate_open(p_scope text) RETURNS boolean
LANGUAGE sql VOLATILE
RETURN COALESCE((SELECT work_rate_room(l.id, l.per, 1) > 0 FROM work_limits AS l
                 WHERE l.scope = p_scope AND l.rate IS NOT NULL), true);

-- -- limits, held where a row becomes Running ----------------------------------------------

-- Raise the named refusal of a start over a limit (SQLSTATE 23514, as a CHECK's).
CREATE FUNCTION work_refuse_start(p_constraint text, p_message text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'check_violation', CONSTRAINT = p_constraint,
        MESSAGE = p_message, TABLE = 'work_items';
END
$$;

-- The lowest slot in 1..p_limit that no other Running item of the scope (p_kind NULL)
-- or kind holds, as this statement's snapshot sees them (NULL: all are held), and how
-- many other Running items it has.
CREATE FUNCTION work_free_slot(
    p_scope text, p_kind text, p_limit integer, p_except bigint,
    OUT slot integer, OUT held integer
)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    taken integer[];
BEGIN
    IF p_kind IS NULL THEN
        SELECT COALESCE(array_agg(r.scope_slot), '{}') INTO taken FROM work_items AS r
        WHERE r.scope = p_scope AND r.status = 'Running' AND r.id <> p_except;
    ELSE
        SELECT COALESCE(array_agg(r.kind_slot), '{}') INTO taken FROM work_items AS r
        WHERE r.kind = p_kind AND r.status = 'Running' AND r.id <> p_except;
    END IF;
    held := cardinality(taken);
    SELECT min(g.n) INTO slot FROM generate_series(1, p_limit) AS g (n)
    WHERE g.n <> ALL(array_remove(taken, NULL));
END
$$;

-- Take one open rate slot of limit p_limit_id for a start now, or refuse the start.
CREATE FUNCTION work_take_rate_slot(p_limit_id bigint, p_per interval, p_what text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE work_rate_slots SET started_at = now()
    WHERE (limit_id, slot) = (SELECT s.limit_id, s.slot FROM work_rate_slots AS s
                              WHERE s.limit_id = p_limit_id AND s.started_at <= now() - p_per
                              ORDER BY s.started_at LIMIT 1
                              FOR UPDATE SKIP LOCKED);
    IF NOT FOUND THEN
        PERFORM work_refuse_start('work_items_rate_within_limit',
                                  format('%s has no start left in its rate window', p_what));
    END IF;
END
$$;

-- The slot a start of `p_scope` (p_kind NULL) or of `p_kind` takes under limit
-- `p_limit`: the lowest free one. With every slot held, the limit's own: the unique
-- index then refuses the start by its name (after waiting out an uncommitted holder),
-- exactly as the one-per-scope index did. With a slot free but as many Running as the
-- limit (a limit lowered while they ran, or a kind's items Running from before its
-- limit), the start is refused as work_items_slot_within_limit.
CREATE FUNCTION work_start_slot(p_scope text, p_kind text, p_limit integer, p_except bigint)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    free record := work_free_slot(p_scope, p_kind, p_limit, p_except);
BEGIN
    IF free.slot IS NULL THEN
        RETURN p_limit;
    END IF;
    IF free.held >= p_limit THEN
        PERFORM work_refuse_start('work_items_slot_within_limit',
            format('%s %s has %s Running, its limit is %s',
                   CASE WHEN p_kind IS NULL THEN 'scope' ELSE 'kind' END,
                   COALESCE(p_kind, p_scope), free.held, p_limit));
    END IF;
    RETURN free.slot;
END
$$;

-- A row becoming Running (a claim, or anyone's UPDATE or INSERT) takes its slots and
-- rate slots, or is refused by name; a row leaving Running gives its slots back.
CREATE FUNCTION work_items_take_slot() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    lim work_limits;
BEGIN
    IF NEW.status <> 'Running' THEN
        NEW.scope_slot := NULL;
        NEW.kind_slot := NULL;
        IF TG_OP = 'UPDATE' AND OLD.kind_slot IS NOT NULL THEN
            PERFORM pg_notify('trioworker', '');  -- a limited kind has room again
        END IF;
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.status = 'Running'
       AND (OLD.scope, OLD.kind) IS NOT DISTINCT FROM (NEW.scope, NEW.kind) THEN
        NEW.scope_slot := OLD.scope_slot;  -- still Running: its slots stay
        NEW.kind_slot := OLD.kind_slot;
        RETURN NEW;
    END IF;
    NEW.scope_slot := NULL;
    IF NEW.scope IS NOT NULL THEN
        NEW.scope_slot := work_start_slot(NEW.scope, NULL,
                                          work_scope_running_limit(NEW.scope), NEW.id);
    END IF;
    SELECT * INTO lim FROM work_limits WHERE kind = NEW.kind;
    NEW.kind_slot := NULL;
    IF lim.running IS NOT NULL THEN
        NEW.kind_slot := work_start_slot(NULL, NEW.kind, lim.running, NEW.id);
    END IF;
    IF lim.rate IS NOT NULL THEN
        PERFORM work_take_rate_slot(lim.id, lim.per, format('kind %s', NEW.kind));
    END IF;
    IF NEW.scope IS NOT NULL THEN
        SELECT * INTO lim FROM work_limits WHERE scope = NEW.scope;
        IF lim.rate IS NOT NULL THEN
            PERFORM work_take_rate_slot(lim.id, lim.per, format('scope %s', NEW.scope));
        END IF;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER work_items_take_slot
    BEFORE INSERT OR UPDATE OF status, scope, kind, scope_slot, kind_slot ON work_items
    FOR EACH ROW
    WHEN (NEW.status = 'Running' OR NEW.scope_slot IS NOT NULL OR NEW.kind_slot IS NOT NULL)
    EXECUTE FUNCTION work_items_take_slot();

-- -- limits, changed ---------------------------------------------------------------------

-- A limit added, changed or removed (by work_set_limit_v1 or by hand): its rate slots
-- follow its rate (the latest starts kept, so a changed rate still counts them), and
-- idle Workers are woken to claim what it now allows.
CREATE FUNCTION work_limits_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    kept timestamptz[];
BEGIN
    IF TG_OP <> 'DELETE' AND (TG_OP = 'INSERT' OR NEW.rate IS DISTINCT FROM OLD.rate) THEN
        SELECT COALESCE(array_agg(started_at ORDER BY started_at DESC), '{}') INTO kept
        FROM (SELECT started_at FROM work_rate_slots WHERE limit_id = NEW.id
              ORDER BY started_at DESC LIMIT NEW.rate FOR UPDATE) AS latest;
        DELETE FROM work_rate_slots WHERE limit_id = NEW.id;
        INSERT INTO work_rate_slots (limit_id, slot, started_at)
        SELECT NEW.id, g.n, COALESCE(kept[g.n], '-infinity')
        FROM generate_series(1, NEW.rate) AS g (n);
    END IF;
    PERFORM pg_notify('trioworker', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER work_limits_changed
    AFTER INSERT OR UPDATE OR DELETE ON work_limits
    FOR EACH ROW EXECUTE FUNCTION work_limits_changed();

-- A scope's running limit (or the default) changed: the scopes it covers are settled
-- again, since a raised limit gives a busy scope heads. At commit, after every claim
-- and settle in flight has ended: each holds the limits lock (29817, 0) shared for
-- its transaction, and this waits for it exclusively, so a claim that read the old
-- limit has committed before the scopes to settle are read, and every claim or settle
-- after this commit reads the new limit. (The lock is held only while the change
-- commits; claims wait for it that long.)
CREATE FUNCTION work_limits_settle() RETURNS trigger
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
    PERFORM pg_advisory_xact_lock(29817, 0);
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

CREATE CONSTRAINT TRIGGER work_limits_settle
    AFTER INSERT OR UPDATE OR DELETE ON work_limits
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    EXECUTE FUNCTION work_limits_settle();

-- Set a limit of a kind (p_kind), a scope (p_scope), or the default running limit of
-- scopes (both NULL): p_running at most Running at once, p_rate starts per p_per
-- seconds. NULL keeps what is set, 0 clears it (p_per with p_rate); a limit left with
-- neither is removed. Returns the limit as it now is (no row: removed).
CREATE FUNCTION work_set_limit_v1(
    p_kind text, p_scope text, p_running integer DEFAULT NULL,
    p_rate integer DEFAULT NULL, p_per double precision DEFAULT NULL
) RETURNS SETOF work_limits
LANGUAGE plpgsql AS $$
DECLARE
    now_running integer;
    now_rate integer;
    now_per interval;
    old work_limits;
BEGIN
    IF p_kind IS NOT NULL AND p_scope IS NOT NULL THEN
        RAISE EXCEPTION 'a limit is for a kind or a scope, not both'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_running < 0 OR p_rate < 0 OR (p_rate > 0 AND NOT p_per > 0) THEN
        RAISE EXCEPTION 'a limit is a positive whole number (0 clears it), a rate needs a period'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO old FROM work_limits
    WHERE kind IS NOT DISTINCT FROM p_kind AND scope IS NOT DISTINCT FROM p_scope
    FOR UPDATE;
    now_running := CASE WHEN p_running IS NULL THEN old.running
                        ELSE NULLIF(p_running, 0) END;
    IF p_rate IS NULL THEN
        now_rate := old.rate;
        now_per := old.per;
    ELSIF p_rate > 0 THEN
        now_rate := p_rate;
        now_per := make_interval(secs => p_per);
    END IF;
    IF now_running IS NULL AND now_rate IS NULL THEN
        DELETE FROM work_limits WHERE id = old.id;
        RETURN;
    END IF;
    IF old.id IS NULL THEN
        RETURN QUERY INSERT INTO work_limits (kind, scope, running, rate, per)
            VALUES (p_kind, p_scope, now_running, now_rate, now_per) RETURNING *;
    ELSE
        RETURN QUERY UPDATE work_limits
            SET running = now_running, rate = now_rate, per = now_per, updated_at = now()
            WHERE id = old.id RETURNING *;
    END IF;
END
$$;

-- Remove a limit of a kind, a scope, or the default (both NULL); false: there was none.
CREATE FUNCTION work_clear_limit_v1(p_kind text, p_scope text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM work_limits
    WHERE kind IS NOT DISTINCT FROM p_kind AND scope IS NOT DISTINCT FROM p_scope;
    RETURN FOUND;
END
$$;

-- -- the rules that read "busy" now read "full" ----------------------------------------

-- A scope is busy when it has as many Running items as its limit allows: settles,
-- arrivals and repairs read that, where they read "has a Running item" before.
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
    -- Read limits no change is committing (work_limits_settle).
    PERFORM pg_advisory_xact_lock_shared(29817, 0);
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
    IF pg_try_advisory_xact_lock_shared(29815, hashtext(r.scope)) THEN
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

-- work_repair_v1, where a free scope is one with room under its limit.
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

CREATE OR REPLACE FUNCTION work_repair_v1(p_limit integer)
RETURNS TABLE (scope text, promoted integer)
LANGUAGE sql AS $$ SELECT * FROM work_repair_v2(p_limit) $$;

-- -- the claim, with limits ----------------------------------------------------------------

-- work_claim_v1 (whose account of rounds, locks and heads holds here), with limits: a
-- scope is passed over when it is full (as many Running as its limit) rather than when
-- it has a Running item, or when its rate window has no start left; a kind at its
-- running limit or out of rate is not read; a batch takes no more of a kind than its
-- limits let start. After the claim, each claimed scope whose limit is over one is
-- settled, so its next item is a head while it has room. The schema holds the limits
-- under races (work_items_take_slot and the slot indexes): a claim that meets a start
-- its snapshot could not see loses by the index's or the refusal's name, and the
-- store claims again.
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
BEGIN
    -- Read limits no change is committing (work_limits_settle).
    PERFORM pg_advisory_xact_lock_shared(29817, 0);
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
                -- Claims of one scope take turns on its claim lock (try only).
                SELECT c.id, c.scope, c.kind, c.priority, c.run_after,
                       c.scope IS NULL OR pg_try_advisory_xact_lock(29816, hashtext(c.scope))
                           AS ours
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

CREATE OR REPLACE FUNCTION work_claim_v1(
    p_worker text, p_lease double precision, p_limit integer, p_kinds text[],
    p_scopes text[] DEFAULT NULL, p_unscoped boolean DEFAULT true
) RETURNS SETOF work_items
LANGUAGE sql AS $$
    SELECT * FROM work_claim_v2(p_worker, p_lease, p_limit, p_kinds, p_scopes, p_unscoped)
$$;

-- work_seconds_until_due_v1, and a rate window that holds due work back: the time
-- until it has a start again.
CREATE FUNCTION work_seconds_until_due_v2(
    p_kinds text[], p_scopes text[] DEFAULT NULL, p_unscoped boolean DEFAULT true
) RETURNS double precision
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
AS $$
DECLARE
    seconds double precision;
    reopens double precision;
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
    -- A rate window that has due work waiting on it opens again when its oldest start
    -- is a period old.
    SELECT EXTRACT(EPOCH FROM min(o.reopens) - now())::float8 INTO reopens
    FROM work_limits AS l
    CROSS JOIN LATERAL (SELECT min(s.started_at) + l.per AS reopens FROM work_rate_slots AS s
                        WHERE s.limit_id = l.id) AS o
    WHERE l.rate IS NOT NULL AND o.reopens > now()
      AND ((l.kind = ANY(p_kinds)
            AND EXISTS (SELECT 1 FROM work_items AS w
                        WHERE w.kind = l.kind AND w.status = 'Queued' AND w.run_after <= now()
                          AND (w.is_head AND p_scopes IS NULL OR w.scope IS NULL AND p_unscoped)))
           OR (l.scope IS NOT NULL AND (p_scopes IS NULL OR l.scope = ANY(p_scopes))
               AND EXISTS (SELECT 1 FROM work_items AS w
                           WHERE w.scope = l.scope AND w.status = 'Queued' AND w.is_head
                             AND w.kind = ANY(p_kinds) AND w.run_after <= now())));
    RETURN LEAST(seconds, reopens);
END
$$;

CREATE OR REPLACE FUNCTION work_seconds_until_due_v1(
    p_kinds text[], p_scopes text[] DEFAULT NULL, p_unscoped boolean DEFAULT true
) RETURNS double precision
LANGUAGE sql STABLE
AS $$ SELECT work_seconds_until_due_v2(p_kinds, p_scopes, p_unscoped) $$;
