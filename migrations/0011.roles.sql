-- Least privilege that holds (issue 32; docs/roles.md).
--
-- docs/grants.sql gives each role of docs/roles.sql what its work needs: an application
-- (trioworker_client) inserts the columns an enqueue sets, reads and cancels; a Worker
-- (trioworker_worker) also renews its leases and registers itself; an operator
-- (trioworker_operator) also sets limits, pauses, resumes, retries and prunes. No role
-- may write what the transitions write (an item's status, attempt, head and slots, the
-- limits and rate slots, the pauses, the failover guard, the attempt history, the
-- scopes noted for settling): each transition's function runs as the schema's owner
-- (SECURITY DEFINER), so the right to make a transition is EXECUTE on its function,
-- which grants.sql gives per role, and nothing else reaches what it writes.
--
-- A definer function must not find its tables by its caller's search_path: a temporary
-- table of the caller's (pg_temp comes first unless named) would stand in for the
-- queue's, and a trigger on it would run as the owner. So each one is pinned to its
-- schema, with pg_temp last, in public too (where work_pin_search_path leaves the
-- others unpinned, to spare their calls the cost). In public the pin is `public,
-- pg_temp`: pg_catalog comes first, implicitly, as in a session's default path. A plan
-- cached under one search_path is made again under another, and work_scope_full is
-- called both from an enqueue's own trigger (the caller's path) and from
-- work_items_confirm_place (the pin): pinned `public, pg_catalog, pg_temp`, a scoped
-- enqueue cost the server 0.90 ms instead of 0.53 (each of its calls planned again);
-- pinned `public, pg_temp`, 0.69 against 0.63 unpinned, within the machine's noise, and
-- a claim and finish of 100 items the same (51 us an item either way). And PUBLIC may
-- not execute one: made SECURITY DEFINER, it would let every role that can connect make
-- its transition.
--
-- Which functions: every version (work_NAME_vN) of the transitions named in
-- work_secure_transitions() below, and the two triggers deferred to the commit, which
-- run as the session's role once the transition that fired them has returned (an
-- item's place in its scope's line, work_items_confirm_place, which an enqueue fires
-- too; a changed limit's scopes noted for settling, work_limits_settle). The others
-- stay SECURITY INVOKER: a helper a transition calls runs as the owner already, and so
-- does a trigger its statements fire; called directly, one can do no more than its
-- caller may. CREATE OR REPLACE makes a function SECURITY INVOKER again, and a new
-- version starts as one, so work_secure_transitions() runs at the end of this migration
-- and after every `migrate` that applied anything (post-apply.secure-transitions.sql),
-- as work_pin_search_path does.
-- depends: 0008.bounds 0010.own-locks

-- An operator's retry with its mark in the item's history (queries.sql sent the mark as
-- a statement of its own, which needs UPDATE on work_items): one more attempt number,
-- noted as `operator-retry` (no Worker ran it), and the reason the item waits with.
-- Neither column is one the triggers watch. The ids retried, as work_retry_v1 returns.
CREATE FUNCTION work_retry_v2(p_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    retried bigint[] := ARRAY(SELECT r.id FROM work_retry_v1(p_ids) AS r (id));
BEGIN
    WITH marked AS (
        UPDATE work_items
        SET attempt = attempt + 1, reason = 'retried by an operator after attempt ' || attempt
        WHERE id = ANY(retried) AND status = 'Queued'
        RETURNING id, attempt
    )
    INSERT INTO work_attempts (item_id, attempt, worker_id, started_at, outcome)
    SELECT id, attempt, NULL, NULL, 'operator-retry' FROM marked;
    RETURN QUERY SELECT unnest(retried);
END
$$;

-- One bounded batch of retention (a Worker's `run --retain`, an operator's `prune`; it
-- was queries.sql's DELETE, which needs DELETE on work_items, of any row): the oldest
-- finished items of the given statuses from p_after on, read from the
-- work_items_finished index in finished_at order (the caller passes the last batch's
-- latest finished_at, so rows of other statuses are walked once in all), rows another
-- transaction holds left alone. Their attempt history goes with them (ON DELETE
-- CASCADE). The finished_at of each row deleted.
CREATE FUNCTION work_delete_finished_v1(
    p_statuses text[], p_after timestamptz, p_older_than double precision, p_batch integer
) RETURNS SETOF timestamptz
LANGUAGE sql AS $$
    WITH doomed AS (
        SELECT id FROM work_items
        WHERE status IN ('Succeeded', 'Failed', 'Cancelled') AND status = ANY(p_statuses)
          AND finished_at >= p_after
          AND finished_at < now() - make_interval(secs => p_older_than)
        ORDER BY finished_at
        LIMIT p_batch
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM work_items AS w USING doomed WHERE w.id = doomed.id
    RETURNING w.finished_at
$$;

-- Make the transitions of the current schema SECURITY DEFINER, pinned to it, and not
-- PUBLIC's to execute; those already so are left alone. Returns how many changed.
CREATE FUNCTION work_secure_transitions() RETURNS integer
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
                            '|delete_finished)_v[0-9]+$')
               OR p.proname IN ('work_items_confirm_place', 'work_limits_settle'))
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

-- In a DO block: yoyo prints the rows of a migration's SELECT.
DO $$ BEGIN PERFORM work_secure_transitions(); END $$;
