-- Keep each scope's head up to date, and wake idle Workers with NOTIFY.
--
-- The head of a scope is its Running item if it has one, otherwise its first Queued
-- item in (run_after, id) order. Only Queued heads (and unscoped Queued items) are in
-- the claim's index, so a claim costs the same however much work waits behind busy
-- scopes. Claiming a head does not move it (the head is now the Running item); every
-- other change that can move a head refreshes it under a per-scope transaction lock,
-- taken before the fresh look at the scope, so two writers of one scope take turns and
-- the later one sees what the earlier one committed.
-- depends: 0001.work-items

CREATE FUNCTION work_items_refresh_head(p_scope text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    head_id bigint;
    head_status text;
    head_due boolean;
    promoted integer;
BEGIN
    -- 29815 is trioworker's advisory lock namespace ('tw').
    PERFORM pg_advisory_xact_lock(29815, hashtext(p_scope));

    SELECT id, status, true INTO head_id, head_status, head_due
    FROM work_items WHERE scope = p_scope AND status = 'Running';
    IF head_id IS NULL THEN
        SELECT id, status, run_after <= now() INTO head_id, head_status, head_due
        FROM work_items WHERE scope = p_scope AND status = 'Queued'
        ORDER BY run_after, id LIMIT 1;
    END IF;

    UPDATE work_items SET is_head = false
    WHERE scope = p_scope AND is_head AND id IS DISTINCT FROM head_id;

    UPDATE work_items SET is_head = true WHERE id = head_id AND NOT is_head;
    GET DIAGNOSTICS promoted = ROW_COUNT;

    IF promoted > 0 AND head_status = 'Queued' AND head_due THEN
        PERFORM pg_notify('trioworker', p_scope);
    END IF;
END
$$;

CREATE FUNCTION work_items_after_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s text;
BEGIN
    FOR s IN
        SELECT DISTINCT scope FROM inserted
        WHERE scope IS NOT NULL AND status IN ('Queued', 'Running')
        ORDER BY scope
    LOOP
        PERFORM work_items_refresh_head(s);
    END LOOP;
    IF EXISTS (
        SELECT 1 FROM inserted
        WHERE scope IS NULL AND status = 'Queued' AND run_after <= now()
    ) THEN
        PERFORM pg_notify('trioworker', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER work_items_after_insert
    AFTER INSERT ON work_items
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION work_items_after_insert();

CREATE FUNCTION work_items_after_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.scope IS NULL THEN
        -- An unscoped item that became due again (a released or requeued item).
        IF NEW.status = 'Queued' AND NEW.run_after <= now() THEN
            PERFORM pg_notify('trioworker', '');
        END IF;
    END IF;
    IF OLD.scope IS NOT NULL AND OLD.scope IS DISTINCT FROM NEW.scope THEN
        PERFORM work_items_refresh_head(OLD.scope);
    END IF;
    IF NEW.scope IS NOT NULL THEN
        PERFORM work_items_refresh_head(NEW.scope);
    END IF;
    RETURN NULL;
END
$$;

-- Fires on every change that can move a head: the head leaves (finishes, is requeued,
-- cancelled), an item becomes Queued or Running, a Queued item is rescheduled, or an
-- unscoped item is queued again. A claim of a head leaves the head where it is, and
-- heartbeats change no watched column, so neither pays for a refresh.
CREATE TRIGGER work_items_after_update
    AFTER UPDATE OF status, run_after, scope ON work_items
    FOR EACH ROW
    WHEN (
        (OLD.status, OLD.run_after, OLD.scope) IS DISTINCT FROM (NEW.status, NEW.run_after, NEW.scope)
        AND CASE
            WHEN OLD.scope IS NULL AND NEW.scope IS NULL THEN NEW.status = 'Queued'
            ELSE NOT (OLD.status = 'Queued' AND NEW.status = 'Running' AND OLD.is_head)
                 AND (OLD.is_head
                      OR NEW.status IN ('Queued', 'Running')
                      OR OLD.scope IS DISTINCT FROM NEW.scope)
        END
    )
    EXECUTE FUNCTION work_items_after_update();

CREATE FUNCTION work_items_after_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM work_items_refresh_head(OLD.scope);
    RETURN NULL;
END
$$;

CREATE TRIGGER work_items_after_delete
    AFTER DELETE ON work_items
    FOR EACH ROW WHEN (OLD.is_head AND OLD.scope IS NOT NULL)
    EXECUTE FUNCTION work_items_after_delete();
