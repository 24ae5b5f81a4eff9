-- Dependencies: an item that runs after other items (issue 34;
-- docs/adr/0015-dependencies.md).
--
-- An enqueue names the item's parents in `after` (bigint[], a column any writer may
-- insert, plain SQL too). Such an item is stored Waiting, not Queued: no claim looks at
-- a Waiting row, so the claim costs nothing more for items without parents. It becomes
-- Queued when every parent has Succeeded, and Cancelled, with a reason that names the
-- parent, when one ends Failed or Cancelled (and so do its own waiting descendants).
--
-- Who moves a Waiting item, and why none waits forever (no party ever waits on a lock:
-- each takes the rows it needs with SKIP LOCKED, and leaves what it could not take to
-- a Worker's settle pass, work_settle_noted_v2, run on NOTIFY and every poll):
--
-- * Its adoption (work_adopt_waiting): its parents, locked, are marked has_children
--   and read. A parent's transition that committed first is read; one that comes later
--   waits for this commit, and its trigger then sees the child. At READ COMMITTED the
--   enqueue's own commit adopts it (work_items_wait_for_parents, a deferred constraint
--   trigger); a parent another transaction holds (its Worker's heartbeat, another
--   enqueue), or an enqueue at REPEATABLE READ or SERIALIZABLE (whose snapshot may be
--   older than a parent's last change: locking it would fail the caller's commit),
--   leaves the child noted in work_unsettled_waiting, announced, for a Worker to adopt.
-- * A parent's last transition (work_items_release_children: Succeeded, Failed or
--   Cancelled, on a row marked has_children): it settles its Waiting children. A child
--   another transaction holds (the last two parents of one child finishing at once, in
--   two transactions) is noted and announced, and a Worker settles it once that
--   transaction has ended.
--
-- What holds the rule whoever writes, read from each item's own `after` (a parent that
-- no longer exists has not Succeeded: it was deleted, so it had ended, and nothing says
-- how): a Waiting item becomes Queued only when every parent has Succeeded
-- (work_items_after_parents_done refuses it by hand otherwise); a retried item whose
-- parents have not all Succeeded waits again; a row with parents is never made Running
-- while one has not Succeeded (the update of that row is passed over); a parent that
-- Succeeded keeps Succeeded while a child still needs it, and is not deleted until then
-- (work_items_keep_needed_parents). Parents come before their children (a parent's id is
-- lower): no cycle can wait forever. work_dependencies is the index from a parent to its
-- children; it takes no lock on a parent (no foreign key to it: a foreign key's check
-- would hold the parent's row against a claim until the enqueue's transaction ends).
--
-- As 0002.results-steps: append-only; the transitions it changes are new versions
-- (work_request_cancel_v2, work_settle_noted_v2, work_delete_finished_v2) beside the
-- old, and work_secure_transitions() is redefined whole to secure its functions.
-- depends: 0002.results-steps

ALTER TABLE work_items
    -- The parents it was enqueued after, as given (NULL: none). Kept as written.
    ADD COLUMN after bigint[],
    -- Set on a parent when a child's enqueue commits: its last transition then settles
    -- its children (the trigger's WHEN reads it, so items without children pay nothing).
    ADD COLUMN has_children boolean NOT NULL DEFAULT false;

ALTER TABLE work_items DROP CONSTRAINT work_items_status_known;
ALTER TABLE work_items ADD CONSTRAINT work_items_status_known
    CHECK (status IN ('Waiting', 'Queued', 'Running', 'Succeeded', 'Failed', 'Cancelled'));

-- One row per (child, parent): written from `after` by work_items_record_parents, read
-- by a parent to find its children. Deleted with the child (and with its parent by
-- work_items_keep_needed_parents, once no child needs it).
CREATE TABLE work_dependencies (
    child_id  bigint NOT NULL REFERENCES work_items (id) ON DELETE CASCADE,
    parent_id bigint NOT NULL,
    PRIMARY KEY (child_id, parent_id),
    CONSTRAINT work_dependencies_parent_first CHECK (parent_id < child_id)
);

CREATE INDEX work_dependencies_children ON work_dependencies (parent_id);

-- Waiting items a settle met held by another transaction: a Worker settles them.
CREATE TABLE work_unsettled_waiting (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item_id  bigint      NOT NULL,
    noted_at timestamptz NOT NULL DEFAULT now()
);

-- Refuses a statement on a dependency, as a CHECK named p_constraint would.
CREATE FUNCTION work_refuse_dependency(p_constraint text, p_message text, p_id bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'check_violation', CONSTRAINT = p_constraint,
        TABLE = 'work_items',
        MESSAGE = format('new row for relation "work_items" violates %s: %s',
                         p_constraint, p_message),
        DETAIL = format('Failing row has id = %s.', p_id);
END
$$;

-- Settle Waiting items: each that every parent has Succeeded becomes Queued (placed in
-- its scope's line by the triggers, as an enqueue is); each with a parent Failed or
-- Cancelled becomes Cancelled, with its own Waiting descendants, each reason naming
-- the parent; the rest stay. An item another transaction holds is noted for a Worker
-- (announced when p_announce). Never waits on a lock.
--
-- Called by a parent's last transition (p_parent, p_parent_status), only that parent's
-- outcome is read for certain: Failed or Cancelled cancels the children; Succeeded makes
-- each child Queued unless a parent of its has not Succeeded, looked for from the
-- newest parent back (children of a fan-in are claimed oldest first, so the one found
-- is at the end: a fan-in of N children costs N probes in all, not N squared). A child
-- left Waiting beside a Failed parent is that parent's to cancel (its transition, or
-- the note its transition left).
CREATE FUNCTION work_settle_waiting(
    p_ids bigint[], p_announce boolean, p_parent bigint DEFAULT NULL,
    p_parent_status text DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off AS $$
DECLARE
    locked bigint[];
    ready bigint[];
    doomed bigint[];
    because text[];
    frontier bigint[];
    was text;
BEGIN
    SELECT array_agg(l.id ORDER BY l.id) INTO locked FROM (
        SELECT id FROM work_items WHERE id = ANY(p_ids) AND status = 'Waiting'
        ORDER BY id FOR NO KEY UPDATE SKIP LOCKED) AS l;
    INSERT INTO work_unsettled_waiting (item_id)
    SELECT id FROM work_items
    WHERE id = ANY(p_ids) AND status = 'Waiting' AND id <> ALL(COALESCE(locked, '{}'));
    IF FOUND AND p_announce THEN
        PERFORM pg_notify('trioworker_settle', '');
    END IF;
    IF locked IS NULL THEN
        RETURN;
    END IF;

    IF p_parent_status IN ('Failed', 'Cancelled') THEN
        doomed := locked;
        because := array_fill(format('parent %s %s', p_parent,
            CASE p_parent_status WHEN 'Failed' THEN 'failed' ELSE 'was cancelled' END),
            ARRAY[cardinality(locked)]);
    ELSIF p_parent_status = 'Succeeded' THEN
        SELECT array_agg(c.id) INTO ready
        FROM work_items AS c
        WHERE c.id = ANY(locked)
          AND NOT EXISTS (
              SELECT 1 FROM (SELECT u.a FROM unnest(c.after) WITH ORDINALITY AS u (a, n)
                             ORDER BY u.n DESC) AS newest_first
              WHERE NOT EXISTS (SELECT 1 FROM work_items AS p
                                WHERE p.id = newest_first.a AND p.status = 'Succeeded'));
    ELSE
        -- Each child's verdict, from the parent that decides it: one gone, Failed or
        -- Cancelled first, else any that has not Succeeded (none: ready).
        SELECT array_agg(c.id) FILTER (WHERE b.id IS NULL),
               array_agg(c.id) FILTER (WHERE b.ended),
               array_agg(format('parent %s %s', b.id,
                                CASE b.status WHEN 'Failed' THEN 'failed'
                                              WHEN 'Cancelled' THEN 'was cancelled'
                                              ELSE 'no longer exists' END))
                   FILTER (WHERE b.ended)
        INTO ready, doomed, because
        FROM work_items AS c
        LEFT JOIN LATERAL (
            SELECT u.a AS id, p.status, p.status IS DISTINCT FROM 'Waiting'
                   AND p.status IS DISTINCT FROM 'Queued'
                   AND p.status IS DISTINCT FROM 'Running' AS ended
            FROM unnest(c.after) AS u (a)
            LEFT JOIN work_items AS p ON p.id = u.a
            WHERE p.status IS DISTINCT FROM 'Succeeded'
            ORDER BY 3 DESC, u.a
            LIMIT 1) AS b ON true
        WHERE c.id = ANY(locked);
    END IF;

    IF ready IS NOT NULL THEN
        -- As an enqueue arrives (trioworker.internal off: the triggers place each in its
        -- line and announce it).
        was := COALESCE(current_setting('trioworker.internal', true), '');
        PERFORM set_config('trioworker.internal', '', true);
        UPDATE work_items SET status = 'Queued' WHERE id = ANY(ready);
        PERFORM set_config('trioworker.internal', was, true);
        IF EXISTS (SELECT 1 FROM work_items
                   WHERE id = ANY(ready) AND scope IS NULL AND run_after <= now()) THEN
            PERFORM pg_notify('trioworker', '');
        END IF;
    END IF;

    IF doomed IS NOT NULL THEN
        -- Level by level (work_items_release_children leaves a cascade to this loop).
        was := COALESCE(current_setting('trioworker.cascading', true), '');
        PERFORM set_config('trioworker.cascading', 'on', true);
        UPDATE work_items AS w
        SET status = 'Cancelled', finished_at = now(), is_head = false, reason = r.reason
        FROM unnest(doomed, because) AS r (id, reason)
        WHERE w.id = r.id;
        frontier := doomed;
        LOOP
            SELECT array_agg(l.id ORDER BY l.id) INTO locked FROM (
                SELECT id FROM work_items
                WHERE id IN (SELECT child_id FROM work_dependencies
                             WHERE parent_id = ANY(frontier))
                  AND status = 'Waiting'
                ORDER BY id FOR NO KEY UPDATE SKIP LOCKED) AS l;
            INSERT INTO work_unsettled_waiting (item_id)
            SELECT id FROM work_items
            WHERE id IN (SELECT child_id FROM work_dependencies WHERE parent_id = ANY(frontier))
              AND status = 'Waiting' AND id <> ALL(COALESCE(locked, '{}'));
            IF FOUND AND p_announce THEN
                PERFORM pg_notify('trioworker_settle', '');
            END IF;
            EXIT WHEN locked IS NULL;
            UPDATE work_items AS w
            SET status = 'Cancelled', finished_at = now(), is_head = false,
                reason = (SELECT format('parent %s was cancelled', min(d.parent_id))
                          FROM work_dependencies AS d
                          WHERE d.child_id = w.id AND d.parent_id = ANY(frontier))
            WHERE w.id = ANY(locked);
            frontier := locked;
        END LOOP;
        PERFORM set_config('trioworker.cascading', was, true);
    END IF;
END
$$;

-- An insert with parents: checked, stored Waiting (before work_items_arrive, which
-- then leaves it out of every line: BEFORE triggers run in name order).
-- An update into Queued or Running of a row with parents: into Queued from Waiting
-- only when every parent has Succeeded (else refused); into Queued from elsewhere (a
-- retry) it waits again; into Running it is passed over (the row is left as it was).
CREATE FUNCTION work_items_after_parents() RETURNS trigger
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off AS $$
DECLARE
    undone record;
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF cardinality(NEW.after) NOT BETWEEN 1 AND 1000
           OR array_position(NEW.after, NULL) IS NOT NULL THEN
            PERFORM work_refuse_dependency('work_items_after_bounded',
                'after names 1 to 1000 parents, none NULL', NEW.id);
        END IF;
        IF NEW.status <> 'Queued' OR NEW.dedup_key IS NOT NULL THEN
            PERFORM work_refuse_dependency('work_items_after_queued',
                'an item with parents is enqueued Queued (it is stored Waiting) and'
                ' without a dedup key', NEW.id);
        END IF;
        NEW.status := 'Waiting';
        NEW.is_head := false;
        RETURN NEW;
    END IF;
    SELECT u.a AS id, COALESCE(p.status, 'gone') AS status INTO undone
    FROM unnest(NEW.after) AS u (a)
    LEFT JOIN work_items AS p ON p.id = u.a
    WHERE p.status IS DISTINCT FROM 'Succeeded'
    ORDER BY u.a LIMIT 1;
    IF NOT FOUND THEN
        RETURN NEW;
    END IF;
    IF NEW.status = 'Running' THEN
        RETURN NULL;
    END IF;
    IF OLD.status = 'Waiting' THEN
        PERFORM work_refuse_dependency('work_items_after_parents_done',
            format('a Waiting item becomes Queued once every parent has Succeeded'
                   ' (parent %s is %s)', undone.id, undone.status), NEW.id);
    END IF;
    NEW.status := 'Waiting';
    NEW.is_head := false;
    RETURN NEW;
END
$$;

CREATE TRIGGER work_items_after_parents
    BEFORE INSERT ON work_items
    FOR EACH ROW WHEN (NEW.after IS NOT NULL)
    EXECUTE FUNCTION work_items_after_parents();

CREATE TRIGGER work_items_after_parents_done
    BEFORE UPDATE OF status ON work_items
    FOR EACH ROW WHEN (NEW.after IS NOT NULL AND NEW.status IN ('Queued', 'Running')
                       AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION work_items_after_parents();

-- The parents, as rows (their ids checked here: an unknown one is named).
CREATE FUNCTION work_items_record_parents() RETURNS trigger
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off AS $$
DECLARE
    unknown bigint[];
BEGIN
    SELECT array_agg(a ORDER BY a) INTO unknown
    FROM unnest(NEW.after) AS a
    WHERE NOT EXISTS (SELECT 1 FROM work_items WHERE id = a);
    IF unknown IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
            CONSTRAINT = 'work_items_after_known', TABLE = 'work_items',
            MESSAGE = format('after names items that do not exist: %s',
                             array_to_string(unknown, ', ')),
            DETAIL = format('Failing row has id = %s.', NEW.id);
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(NEW.after) AS a WHERE a >= NEW.id) THEN
        PERFORM work_refuse_dependency('work_dependencies_parent_first',
            'a parent is enqueued before its children (its id is lower)', NEW.id);
    END IF;
    INSERT INTO work_dependencies (child_id, parent_id)
    SELECT DISTINCT NEW.id, a FROM unnest(NEW.after) AS a;
    RETURN NULL;
END
$$;

CREATE TRIGGER work_items_record_parents
    AFTER INSERT ON work_items
    FOR EACH ROW WHEN (NEW.after IS NOT NULL)
    EXECUTE FUNCTION work_items_record_parents();

-- Adopt Waiting items: each whose parents could all be locked (SKIP LOCKED, in id
-- order; a parent that no longer exists needs no lock) has them marked has_children and
-- is settled; the rest are noted for a Worker (announced when p_announce).
CREATE FUNCTION work_adopt_waiting(p_ids bigint[], p_announce boolean) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off AS $$
DECLARE
    parents bigint[];
    held bigint[];
    adopted bigint[];
    blocked bigint[];
BEGIN
    SELECT array_agg(DISTINCT a) INTO parents
    FROM work_items AS c, unnest(c.after) AS a
    WHERE c.id = ANY(p_ids) AND c.status = 'Waiting';
    -- Parents that exist but another transaction holds; the others are locked here.
    SELECT COALESCE(array_agg(p.id), '{}') INTO held FROM work_items AS p
    WHERE p.id = ANY(parents)
      AND p.id NOT IN (SELECT l.id FROM work_items AS l WHERE l.id = ANY(parents)
                       ORDER BY l.id FOR NO KEY UPDATE SKIP LOCKED);
    UPDATE work_items SET has_children = true
    WHERE id = ANY(parents) AND id <> ALL(held) AND NOT has_children;
    SELECT array_agg(c.id) FILTER (WHERE c.after && held),
           array_agg(c.id) FILTER (WHERE NOT COALESCE(c.after && held, false))
    INTO blocked, adopted
    FROM work_items AS c WHERE c.id = ANY(p_ids) AND c.status = 'Waiting';
    IF blocked IS NOT NULL THEN
        INSERT INTO work_unsettled_waiting (item_id) SELECT unnest(blocked);
        IF p_announce THEN
            PERFORM pg_notify('trioworker_settle', '');
        END IF;
    END IF;
    IF adopted IS NOT NULL THEN
        PERFORM work_settle_waiting(adopted, p_announce);
    END IF;
END
$$;

-- At commit of an item made Waiting (its enqueue, or a retry): adopted at READ
-- COMMITTED; at a stricter level, noted for a Worker (see the top of this file).
CREATE FUNCTION work_items_wait_for_parents() RETURNS trigger
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM work_adopt_waiting(ARRAY[NEW.id], true);
    ELSE
        INSERT INTO work_unsettled_waiting (item_id) VALUES (NEW.id);
        PERFORM pg_notify('trioworker_settle', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER work_items_wait_for_parents
    AFTER INSERT OR UPDATE OF status ON work_items
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.status = 'Waiting')
    EXECUTE FUNCTION work_items_wait_for_parents();

-- A parent's last transition settles its Waiting children (a cascade's own
-- cancellations are left to its loop, in work_settle_waiting).
CREATE FUNCTION work_items_release_children() RETURNS trigger
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off AS $$
BEGIN
    IF current_setting('trioworker.cascading', true) = 'on' THEN
        RETURN NULL;
    END IF;
    PERFORM work_settle_waiting(
        ARRAY(SELECT child_id FROM work_dependencies WHERE parent_id = NEW.id), true,
        NEW.id, NEW.status);
    RETURN NULL;
END
$$;

CREATE TRIGGER work_items_release_children
    AFTER UPDATE OF status ON work_items
    FOR EACH ROW WHEN (NEW.has_children AND OLD.status IS DISTINCT FROM NEW.status
                       AND NEW.status IN ('Succeeded', 'Failed', 'Cancelled'))
    EXECUTE FUNCTION work_items_release_children();

-- A parent a child still needs (its result, or its Succeeded) stays: not deleted, and
-- not moved from Succeeded, while a child is Waiting, Queued or Running.
CREATE FUNCTION work_items_keep_needed_parents() RETURNS trigger
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off AS $$
DECLARE
    needy bigint;
BEGIN
    SELECT c.id INTO needy FROM work_dependencies AS d
    JOIN work_items AS c ON c.id = d.child_id
    WHERE d.parent_id = OLD.id AND c.status IN ('Waiting', 'Queued', 'Running')
    ORDER BY c.id LIMIT 1;
    IF FOUND THEN
        PERFORM work_refuse_dependency('work_items_needed_parent_stays',
            format('item %s is a parent that item %s still needs', OLD.id, needy), OLD.id);
    END IF;
    IF TG_OP = 'DELETE' THEN
        DELETE FROM work_dependencies WHERE parent_id = OLD.id;
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER work_items_keep_needed_parents
    BEFORE DELETE ON work_items
    FOR EACH ROW WHEN (OLD.has_children)
    EXECUTE FUNCTION work_items_keep_needed_parents();

CREATE TRIGGER work_items_keep_succeeded_parents
    BEFORE UPDATE OF status ON work_items
    FOR EACH ROW WHEN (OLD.has_children AND OLD.status = 'Succeeded'
                       AND NEW.status <> 'Succeeded')
    EXECUTE FUNCTION work_items_keep_needed_parents();

-- `after` is kept as it was enqueued.
CREATE TRIGGER work_items_after_kept
    BEFORE UPDATE OF after ON work_items
    FOR EACH ROW WHEN (OLD.after IS DISTINCT FROM NEW.after)
    EXECUTE FUNCTION work_refuse_row(
        'work_items_after_kept', 'after is kept as the item was enqueued', 'id');

-- A cancel: as work_request_cancel_v1, and a Waiting item is cancelled as a Queued one
-- is (its waiting descendants with it).
CREATE FUNCTION work_request_cancel_v2(p_id bigint) RETURNS text
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
DECLARE
    was text := work_internal_begin();
    r record;
BEGIN
    UPDATE work_items
    SET status = CASE WHEN status IN ('Queued', 'Waiting') THEN 'Cancelled' ELSE status END,
        finished_at = CASE WHEN status IN ('Queued', 'Waiting') THEN now() ELSE finished_at END,
        reason = CASE WHEN status IN ('Queued', 'Waiting') THEN 'cancelled before it ran'
                      ELSE reason END,
        is_head = false,
        cancel_requested = true
    WHERE id = p_id AND status IN ('Waiting', 'Queued', 'Running') AND completed_at IS NULL
    RETURNING status, scope INTO r;
    IF r.status = 'Cancelled' AND r.scope IS NOT NULL THEN
        PERFORM work_settle_scopes(ARRAY[r.scope]);
    END IF;
    PERFORM work_internal_end(was);
    RETURN r.status;
END
$$;

-- The settle pass: the scopes noted (work_settle_noted_v1), then the Waiting items
-- noted, up to p_limit of each. Returns how many of both it settled.
CREATE FUNCTION work_settle_noted_v2(p_limit integer) RETURNS integer
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
DECLARE
    n integer := work_settle_noted_v1(p_limit);
    ids bigint[];
BEGIN
    WITH taken AS (
        DELETE FROM work_unsettled_waiting
        WHERE id IN (SELECT id FROM work_unsettled_waiting ORDER BY id LIMIT p_limit
                     FOR UPDATE SKIP LOCKED)
        RETURNING item_id
    )
    SELECT array_agg(DISTINCT item_id) INTO ids FROM taken;
    IF ids IS NOT NULL THEN
        -- Not announced: one still held is settled at a later pass.
        PERFORM work_adopt_waiting(ids, false);
        n := n + cardinality(ids);
    END IF;
    RETURN n;
END
$$;

-- Retention: as work_delete_finished_v1, passing over a parent that a child still needs.
CREATE FUNCTION work_delete_finished_v2(
    p_statuses text[], p_after timestamptz, p_older_than double precision, p_batch integer
) RETURNS SETOF timestamptz
LANGUAGE sql AS $$
    WITH doomed AS (
        SELECT id FROM work_items AS w
        WHERE status IN ('Succeeded', 'Failed', 'Cancelled') AND status = ANY(p_statuses)
          AND finished_at >= p_after
          AND finished_at < now() - make_interval(secs => p_older_than)
          AND NOT (w.has_children AND EXISTS (
              SELECT 1 FROM work_dependencies AS d JOIN work_items AS c ON c.id = d.child_id
              WHERE d.parent_id = w.id AND c.status IN ('Waiting', 'Queued', 'Running')))
        ORDER BY finished_at
        LIMIT p_batch
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM work_items AS w USING doomed WHERE w.id = doomed.id
    RETURNING w.finished_at
$$;

-- work_secure_transitions() of 0002.results-steps, whole, with this migration's: its
-- new versions (by their names' pattern) and the trigger functions that write rows the
-- enqueuing role has no grant on (work_dependencies, a parent's has_children).
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
               OR p.proname IN ('work_items_confirm_place', 'work_limits_settle',
                                'work_items_record_parents', 'work_items_wait_for_parents',
                                'work_items_release_children', 'work_items_after_parents',
                                'work_items_keep_needed_parents'))
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
