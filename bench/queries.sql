-- The benchmarks' own statements, each under a `-- name:` header (parsed like
-- trioworker/sql/queries.sql). Loading goes through trioworker's triggers, as any
-- plain-SQL enqueue does: each item takes its place in its scope's line.

-- name: insert_running
-- One Running item in each of %(scopes)s scopes, PREFIX0 .. PREFIX(n-1): busy scopes.
INSERT INTO work_items (kind, scope, status, attempt, worker_id, lease_expires_at,
                        started_at, heartbeat_at)
SELECT 'Busy', %(prefix)s || g, 'Running', 1, 'bench-holder',
       now() + interval '1 day', now(), now()
FROM generate_series(0, %(scopes)s - 1) AS g;

-- name: insert_running_of_kind
-- %(n)s Running unscoped items of %(kind)s (they take its kind slots).
INSERT INTO work_items (kind, status, attempt, worker_id, lease_expires_at, started_at,
                        heartbeat_at)
SELECT %(kind)s, 'Running', 1, 'bench-holder', now() + interval '1 day', now(), now()
FROM generate_series(1, %(n)s);

-- name: insert_waiting
-- %(n)s items of %(kind)s, due an hour ago, each after one of the Running items of kind
-- Busy (round robin; issue 34's dependencies, Waiting while their parents run), half
-- unscoped and half over 1,000 scopes.
INSERT INTO work_items (kind, scope, after, run_after)
SELECT %(kind)s, CASE WHEN mod(g, 2) = 0 THEN 'waiting-' || mod(g, 1000) END,
       ARRAY[p.ids[1 + mod(g, cardinality(p.ids))]], now() - interval '1 hour'
FROM generate_series(0, %(n)s - 1) AS g,
     (SELECT array_agg(id ORDER BY id) AS ids FROM work_items WHERE kind = 'Busy') AS p;

-- name: set_default_limit
SELECT * FROM work_set_limit_v1(NULL, NULL, %(running)s);

-- name: set_limit
SELECT * FROM work_set_limit_v1(%(kind)s, NULL, %(running)s, %(rate)s, %(per)s);

-- name: spend_rate
-- Every start of the kind's rate window used just now.
UPDATE work_rate_slots SET started_at = now()
WHERE limit_id = (SELECT id FROM work_limits WHERE kind = %(kind)s);

-- name: limit_scope_rates
-- A rate of 10 starts a day on each of %(scopes)s scopes.
SELECT count(*) AS limited
FROM generate_series(0, %(scopes)s - 1) AS g,
     LATERAL work_set_limit_v1(NULL, %(prefix)s || g, NULL, 10, 86400.0) AS l;

-- name: spend_scope_rates
-- Every start of those scopes' rate windows used just now (settle_scopes then settles
-- them, as the finish of each one's last start does: a spent scope holds no heads).
UPDATE work_rate_slots SET started_at = now()
WHERE limit_id IN (SELECT id FROM work_limits WHERE starts_with(scope, %(prefix)s));

-- name: settle_scopes
-- Settle %(prefix)s's scopes, as a Worker's finish does.
SELECT work_settle_scopes(ARRAY(SELECT scope FROM work_limits
                                WHERE starts_with(scope, %(prefix)s))) AS promoted;

-- name: insert_queued
-- %(n)s Queued items, round robin over %(scopes)s scopes (unscoped when 0), due
-- %(age)s seconds ago: an older backlog is ahead of newer items in scheduling order.
INSERT INTO work_items (kind, scope, run_after)
SELECT %(kind)s,
       CASE WHEN %(scopes)s > 0 THEN %(prefix)s || mod(g, %(scopes)s) END,
       now() - make_interval(secs => %(age)s)
FROM generate_series(0, %(n)s - 1) AS g;

-- name: pause_scopes
-- Pause %(scopes)s scopes, as `python -m trioworker pause --scope` does, one by one.
SELECT count(*) FILTER (WHERE work_pause_v1(NULL, %(prefix)s || g)) AS paused
FROM generate_series(0, %(scopes)s - 1) AS g;

-- name: insert_mixed
-- %(n)s Queued items, alternately unscoped and scoped (round robin over %(scopes)s).
INSERT INTO work_items (kind, scope)
SELECT %(kind)s, CASE WHEN mod(g, 2) = 1 THEN %(prefix)s || mod(g / 2, %(scopes)s) END
FROM generate_series(0, %(n)s - 1) AS g;

-- name: insert_lines
-- As insert_mixed, but each scoped item at one of %(lines)s priorities, so each scope
-- has that many lines (and heads): claims can meet on different heads of one scope.
INSERT INTO work_items (kind, scope, priority)
SELECT %(kind)s, CASE WHEN mod(g, 2) = 1 THEN %(prefix)s || mod(g / 2, %(scopes)s) END,
       CASE WHEN mod(g, 2) = 1 THEN mod(g / (2 * %(scopes)s), %(lines)s) ELSE 0 END
FROM generate_series(0, %(n)s - 1) AS g;

-- name: plain_index
-- The index a plain NOT EXISTS claim needs to walk Queued items in scheduling order
-- (what a queue without scope lines would have).
CREATE INDEX bench_plain_queued ON work_items (priority DESC, run_after, id)
    WHERE status = 'Queued';

-- name: claim
-- trioworker's claim as plain SQL calls it: the public function, one item of the
-- kinds the benchmark's Worker serves.
SELECT id, kind, scope, attempt FROM work_claim_v3(%(worker_id)s, %(lease)s, 1, %(kinds)s);

-- name: plain_claim
-- The baseline: a claim without scope lines, so it walks every Queued item of a busy
-- or paused scope (and of kinds it does not serve) until it finds one it may take.
WITH candidate AS (
    SELECT w.id
    FROM work_items AS w
    WHERE w.status = 'Queued'
      AND w.run_after <= now()
      AND w.kind = ANY(%(kinds)s)
      AND (w.scope IS NULL OR NOT EXISTS (
            SELECT 1 FROM work_items AS r
            WHERE r.scope = w.scope AND r.status = 'Running'))
      AND NOT EXISTS (
            SELECT 1 FROM work_pauses AS p WHERE p.scope = w.scope OR p.kind = w.kind)
    ORDER BY w.priority DESC, w.run_after, w.id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE work_items AS w
SET status = 'Running',
    attempt = w.attempt + 1,
    worker_id = %(worker_id)s,
    lease_expires_at = now() + make_interval(secs => %(lease)s),
    heartbeat_at = now(),
    started_at = now()
FROM candidate
WHERE w.id = candidate.id
RETURNING w.id, w.kind, w.scope, w.attempt;

-- name: most_running_in_a_scope
-- The scope rule's check: never above 1.
SELECT coalesce(max(n), 0) AS n
FROM (SELECT count(*) AS n FROM work_items
      WHERE status = 'Running' AND scope IS NOT NULL GROUP BY scope) AS per_scope;

-- name: count_status
SELECT count(*) FROM work_items WHERE status = %(status)s;

-- name: vacuum_analyze
-- The end-to-end runs' statistics, taken after the warm-up: a queue that deletes its
-- finished jobs is empty then. A bare ANALYZE records it as 0 rows on the pages it still
-- has, and the planner then takes the 10,000 queued for 1 row; VACUUM first truncates
-- those pages, and the planner scales its estimate with the table's size instead.
VACUUM ANALYZE;

-- name: table_statistics
-- What the planner starts from for each table: pages and rows as last recorded.
SELECT c.relname, c.relpages, c.reltuples
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname NOT IN ('pg_catalog', 'information_schema')
ORDER BY n.nspname, c.relname;

-- name: vacuum
VACUUM work_items;

-- name: unfinished
SELECT count(*) FROM work_items WHERE status IN ('Waiting', 'Queued', 'Running');

-- name: insert_fan_roots
-- %(groups)s roots of fans (issue 34's dependencies): each is followed by
-- insert_fan_children and insert_fan_ins, in the same transaction.
INSERT INTO work_items (kind) SELECT %(kind)s FROM generate_series(1, %(groups)s)
RETURNING id;

-- name: insert_fan_children
-- %(children)s items after each of the roots %(roots)s.
INSERT INTO work_items (kind, after)
SELECT %(kind)s, ARRAY[r] FROM unnest(%(roots)s::bigint[]) AS r, generate_series(1, %(children)s)
RETURNING id, after[1] AS root;

-- name: insert_fan_in
-- One item after the items %(parents)s.
INSERT INTO work_items (kind, after) VALUES (%(kind)s, %(parents)s::bigint[]) RETURNING id;

-- name: procrastinate_unfinished
SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing');

-- name: pgqueuer_unfinished
-- pgqueuer deletes a job from its queue table when it finishes (and logs it elsewhere).
SELECT count(*) FROM pgqueuer;

-- name: other_backends
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid();

-- name: pgbench_update
-- A pgbench script: one single-row UPDATE by primary key per transaction.
\set aid random(1, 100000 * :scale)
UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;

-- name: pgbench_update_notify
-- The same UPDATE with a NOTIFY in its transaction, as a scoped completion that
-- promotes the next head sends one. A notifying commit holds a cluster-wide lock
-- (async.c, "database 0") until after its commit record is flushed, so these commits
-- flush one at a time instead of in groups.
\set aid random(1, 100000 * :scale)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;
SELECT pg_notify('bench', 'x');
COMMIT;

-- name: pauses
-- The same statement as trioworker's own `pauses` read, sent on a plain connection.
SELECT kind, scope, paused_at FROM work_pauses ORDER BY paused_at;

-- name: enqueue
-- An enqueue as any application sends it: a plain INSERT.
INSERT INTO work_items (kind, scope, payload) VALUES (%(kind)s, %(scope)s, %(payload)s::jsonb)
RETURNING id;

-- name: insert_finished
-- %(n)s items that finished (Succeeded) %(days)s days ago, spread over an hour, over
-- 1,000 scopes: what retention deletes.
INSERT INTO work_items (kind, scope, status, attempt, requested_at, run_after,
                        started_at, finished_at)
SELECT 'Old', 'old-' || mod(g, 1000), 'Succeeded', 1, t, t, t, t
FROM generate_series(0, %(n)s - 1) AS g,
     LATERAL (SELECT now() - make_interval(secs => %(days)s * 86400 + mod(g, 3600))) AS at(t);

-- name: delete_finished_at_once
-- The naive retention: one statement, holding every deleted row's lock to its end.
WITH deleted AS (
    DELETE FROM work_items
    WHERE status IN ('Succeeded', 'Failed', 'Cancelled')
      AND finished_at < now() - make_interval(days => %(days)s)
    RETURNING 1
)
SELECT count(*) FROM deleted;

-- name: graphile_add_jobs
-- %(n)s no-op jobs in one call of Graphile Worker's add_jobs (what its addJobs sends),
-- job i in the named queue q-(i mod queues), or in none when queues is 0.
SELECT count(*) FROM graphile_worker.add_jobs(ARRAY(
    SELECT ROW('noop', NULL, CASE WHEN %(queues)s > 0 THEN 'q-' || mod(g, %(queues)s) END,
               NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec
    FROM generate_series(0, %(n)s - 1) AS g
    ORDER BY g
));

-- name: graphile_unfinished
-- Graphile Worker deletes a job when it completes; a failed one stays (and counts).
SELECT count(*) FROM graphile_worker._private_jobs;

-- name: unpin_functions
-- The queue's functions as they were before migration 0004: no search_path of their own,
-- resolved by the caller's (bench schema: what pinning costs).
DO $$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = current_schema()
               AND (p.proname LIKE 'work\_%' OR p.proname = 'pg_notify')
    LOOP
        EXECUTE format('ALTER FUNCTION %s RESET search_path', f);
    END LOOP;
END
$$;

-- name: set_local_search_path
-- The alternative to pinning: each transaction sets its search_path first.
SET LOCAL search_path = public;

-- name: server_loop_function
-- Server-side timing, free of the client and the network: %(n)s claims of the free item,
-- each undone by its subtransaction; seconds per claim. A temporary function, resolved
-- by the session's search_path.
CREATE OR REPLACE FUNCTION pg_temp.bench_claims(p_n integer) RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    FOR i IN 1..p_n LOOP
        BEGIN
            PERFORM * FROM work_claim_v3('bench', 60, 1, ARRAY['Free']);
            RAISE EXCEPTION 'undo' USING ERRCODE = 'P0001';
        EXCEPTION WHEN raise_exception THEN
            NULL;
        END;
    END LOOP;
    RETURN extract(epoch FROM clock_timestamp() - t0) / p_n;
END
$$;

-- name: server_claims
SELECT pg_temp.bench_claims(%(n)s);

-- name: server_insert
-- %(n)s scoped items in one statement (each fires the arrive trigger), rolled back by
-- the caller; EXPLAIN ANALYZE gives the time inside PostgreSQL.
EXPLAIN (ANALYZE, TIMING OFF)
INSERT INTO work_items (kind, scope)
SELECT 'Filler', 'loop-' || (g %% 50) FROM generate_series(1, %(n)s) AS g;

-- name: floor_claim
-- The Worker's claim function for unscoped items of one kind, %(limit)s at a time.
SELECT id, attempt FROM work_claim_v3(%(worker_id)s, %(lease)s, %(limit)s, %(kinds)s);

-- name: floor_finish
-- The Worker's completion of many attempts in one statement.
SELECT count(*) FROM work_finish_v1(%(ids)s, %(attempts)s, 'Succeeded');

-- name: floor_plain_table
-- The least a queue can do in SQL, shaped as Graphile Worker's jobs: a partial index
-- of the available jobs, a claim that locks them, a delete for the finish.
CREATE TABLE floor_jobs (
    id bigserial PRIMARY KEY,
    task text NOT NULL,
    payload json,
    priority integer NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now(),
    attempts integer NOT NULL DEFAULT 0,
    locked_by text,
    locked_at timestamptz,
    is_available boolean GENERATED ALWAYS AS (locked_at IS NULL) STORED
);
CREATE INDEX floor_jobs_available ON floor_jobs (priority, run_at) INCLUDE (id, task)
    WHERE is_available;

-- name: floor_plain_insert
INSERT INTO floor_jobs (task, payload) SELECT 'Noop', '{}' FROM generate_series(1, %(n)s);

-- name: floor_plain_claim
WITH taken AS (
    SELECT j.id FROM floor_jobs AS j
    WHERE j.is_available AND j.run_at <= now() AND j.task = ANY(%(kinds)s)
    ORDER BY j.priority, j.run_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE floor_jobs AS j
SET attempts = j.attempts + 1, locked_by = %(worker_id)s, locked_at = now()
FROM taken WHERE j.id = taken.id
RETURNING j.id;

-- name: floor_plain_finish
DELETE FROM floor_jobs WHERE id = ANY(%(ids)s);

-- name: floor_kept_table
-- The least a queue can do that keeps its finished rows, as work_items does: the same
-- claim over a partial index of the Queued rows, and an UPDATE by primary key for the
-- finish, fenced by attempt, where floor_jobs deletes.
CREATE TABLE floor_kept (
    id bigserial PRIMARY KEY,
    kind text NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}',
    priority integer NOT NULL DEFAULT 0,
    run_after timestamptz NOT NULL DEFAULT now(),
    status text NOT NULL DEFAULT 'Queued',
    attempt integer NOT NULL DEFAULT 0,
    worker_id text,
    lease_expires_at timestamptz,
    finished_at timestamptz
);
CREATE INDEX floor_kept_queued ON floor_kept (kind, priority DESC, run_after, id)
    WHERE status = 'Queued';

-- name: floor_kept_insert
INSERT INTO floor_kept (kind) SELECT 'Noop' FROM generate_series(1, %(n)s);

-- name: floor_kept_claim
WITH taken AS (
    SELECT k.id FROM floor_kept AS k
    WHERE k.status = 'Queued' AND k.kind = ANY(%(kinds)s) AND k.run_after <= now()
    ORDER BY k.kind, k.priority DESC, k.run_after, k.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE floor_kept AS k
SET status = 'Running', attempt = k.attempt + 1, worker_id = %(worker_id)s,
    lease_expires_at = now() + make_interval(secs => %(lease)s)
FROM taken WHERE k.id = taken.id
RETURNING k.id, k.attempt;

-- name: floor_kept_finish
UPDATE floor_kept AS k
SET status = 'Succeeded', finished_at = now()
FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS d (id, attempt)
WHERE k.id = d.id AND k.attempt = d.attempt AND k.status = 'Running';

-- name: floor_lean_claim
-- One statement over work_items' unscoped items (its indexes, triggers and checks as
-- they are): what a claim of unscoped items alone could cost, beside work_claim_v3's
-- machinery for scopes, limits, pauses and kinds. One kind (the first): its highest
-- priority level read from work_items_unscoped as the claim's levels are, then that
-- level's due items in order, looked up by primary key as the claim does. Sent after
-- `SET LOCAL enable_seqscan = off`, in one transaction, as work_claim_v2 runs.
-- Finished by floor_finish.
WITH taken AS (
    SELECT w.id FROM work_items AS w
    WHERE w.status = 'Queued' AND w.scope IS NULL AND w.kind = (%(kinds)s::text[])[1]
      AND w.priority = (SELECT max(u.priority) FROM work_items AS u
                        WHERE u.status = 'Queued' AND u.scope IS NULL
                          AND u.kind = (%(kinds)s::text[])[1])
      AND w.run_after <= now()
    ORDER BY w.run_after, w.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE work_items AS w
SET status = 'Running', attempt = w.attempt + 1, worker_id = %(worker_id)s,
    lease_expires_at = now() + make_interval(secs => %(lease)s),
    heartbeat_at = now(), started_at = now()
WHERE w.id = ANY(ARRAY(SELECT taken.id FROM taken))
RETURNING w.id, w.attempt;

-- name: floor_reset
-- The tables of the server's floor emptied (a bench database of its own).
TRUNCATE work_items, floor_jobs, floor_kept CASCADE;

-- name: bridge_heartbeat
-- The same statement as trioworker's own `heartbeat`, sent on a plain connection.
UPDATE work_items
SET lease_expires_at = now() + make_interval(secs => %(lease)s),
    heartbeat_at = now()
WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'Running'
RETURNING cancel_requested;

-- name: bridge_forty_rows
-- 40 whole rows of work_items back (as a claim of 40 returns them).
SELECT * FROM work_items ORDER BY id LIMIT 40;
