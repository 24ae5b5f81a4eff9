-- The dashboard's read queries (trioworker/dashboard), each under a `-- name:` header.
-- Only SELECTs: each page runs its statements together in one READ ONLY, REPEATABLE
-- READ transaction, so every number on a page comes from the same snapshot and now().
-- The read-only role of docs/dashboard.md may run all of them (SELECT on work_items,
-- work_attempts, work_steps, work_dependencies, work_workers, work_schedules,
-- work_pauses, work_limits and work_rate_slots). What `status` reads too
-- (the counts, the unserved kinds) is the queue's own statement, not a copy (_reader.py).
-- Queue objects come after the schema marker, as in trioworker/_postgres/queries.sql.

-- name: clock
SELECT now() AS now;

-- name: queued
-- Queued items by kind: due now, or delayed (run_after in the future); how long the
-- oldest due one has waited.
SELECT kind,
       count(*) FILTER (WHERE run_after <= now()) AS due,
       count(*) FILTER (WHERE run_after > now()) AS delayed,
       EXTRACT(EPOCH FROM now() - min(run_after) FILTER (WHERE run_after <= now()))::float8
           AS oldest_due_age
FROM /* TEMPLATE: schema */work_items WHERE status = 'Queued'
GROUP BY kind ORDER BY kind;

-- name: scope_summary
-- Busy scopes (with a Running item), the Queued items waiting behind them, scopes
-- with anything Queued, and pauses.
SELECT (SELECT count(DISTINCT scope) FROM /* TEMPLATE: schema */work_items
        WHERE status = 'Running' AND scope IS NOT NULL) AS busy,
       (SELECT count(*) FROM /* TEMPLATE: schema */work_items AS q
        WHERE q.status = 'Queued' AND q.scope IS NOT NULL
          AND EXISTS (SELECT 1 FROM /* TEMPLATE: schema */work_items AS r
                      WHERE r.scope = q.scope AND r.status = 'Running')) AS held,
       (SELECT count(DISTINCT scope) FROM /* TEMPLATE: schema */work_items
        WHERE status = 'Queued' AND scope IS NOT NULL) AS with_queued,
       (SELECT count(*) FROM /* TEMPLATE: schema */work_pauses) AS pauses;

-- name: throughput
-- Items finished in each of the last %(minutes)s whole minutes (the last one is the
-- current, partial minute): bucket 0 is the oldest. Read from the work_items_finished
-- index.
SELECT floor(EXTRACT(EPOCH FROM finished_at - b.start) / 60)::int AS bucket, status,
       count(*) AS n
FROM /* TEMPLATE: schema */work_items,
     LATERAL (SELECT date_trunc('minute', now())
                     - make_interval(mins => %(minutes)s - 1) AS start) AS b
WHERE status IN ('Succeeded', 'Failed', 'Cancelled') AND finished_at >= b.start
GROUP BY 1, 2 ORDER BY 1, 2;

-- name: worker_summary
SELECT count(*) FILTER (WHERE stopped_at IS NULL
                          AND last_seen > now() - make_interval(secs => COALESCE(
                              advertise_every * %(alive_beats)s, %(alive_within)s)))
           AS alive,
       count(*) AS known
FROM /* TEMPLATE: schema */work_workers;

-- (unserved: the queue's own `unserved_kinds`, in sql/queries.sql.)

-- name: running
-- Running items, longest running first; `total` counts them all (beyond the limit).
-- (`kind_slot IS NOT NULL OR kind_slot IS NULL`: each arm matches one of the two
-- indexes that together hold every Running row.)
SELECT id, kind, scope, attempt, stalls, worker_id, started_at, cancel_requested,
       EXTRACT(EPOCH FROM now() - started_at)::float8 AS running_for,
       EXTRACT(EPOCH FROM lease_expires_at - now())::float8 AS lease_left,
       EXTRACT(EPOCH FROM now() - heartbeat_at)::float8 AS heartbeat_age,
       count(*) OVER () AS total
FROM /* TEMPLATE: schema */work_items
WHERE status = 'Running' AND (kind_slot IS NOT NULL OR kind_slot IS NULL)
ORDER BY started_at, id
LIMIT %(limit)s;

-- name: scopes
-- Every scope with a Running item, Queued items or a pause: busy ones first, then
-- paused, then by how much waits; oldest_age: how long its oldest due item has
-- waited. %(search)s (or NULL) keeps scopes containing it.
WITH queued AS (
    SELECT scope, count(*) AS waiting, count(*) FILTER (WHERE run_after <= now()) AS due,
           EXTRACT(EPOCH FROM now() - min(run_after) FILTER (WHERE run_after <= now()))::float8
               AS oldest_age
    FROM /* TEMPLATE: schema */work_items WHERE status = 'Queued' AND scope IS NOT NULL
    GROUP BY scope
), running AS (
    -- A scope may run more than one (its limit, docs/design/limits.md): the first
    -- started is shown, with how many run.
    SELECT DISTINCT ON (scope) scope, id, kind, worker_id, attempt, cancel_requested,
           EXTRACT(EPOCH FROM now() - started_at)::float8 AS running_for,
           count(*) OVER (PARTITION BY scope) AS running
    FROM /* TEMPLATE: schema */work_items WHERE status = 'Running' AND scope IS NOT NULL
    ORDER BY scope, started_at, id
), limited AS (
    SELECT scope, running AS running_limit, rate, EXTRACT(EPOCH FROM per)::float8 AS per
    FROM /* TEMPLATE: schema */work_limits WHERE scope IS NOT NULL
), paused AS (
    SELECT scope, paused_at FROM /* TEMPLATE: schema */work_pauses WHERE scope IS NOT NULL
), scopes AS (
    SELECT scope FROM queued UNION SELECT scope FROM running UNION SELECT scope FROM paused
    UNION SELECT scope FROM limited
)
SELECT s.scope, r.id AS running_id, r.kind AS running_kind, r.worker_id, r.attempt,
       r.cancel_requested, r.running_for, COALESCE(r.running, 0) AS running,
       COALESCE(l.running_limit,
                (SELECT d.running FROM /* TEMPLATE: schema */work_limits AS d
                 WHERE d.kind IS NULL AND d.scope IS NULL), 1) AS running_limit,
       l.running_limit IS NOT NULL AS own_limit, l.rate, l.per,
       COALESCE(q.waiting, 0) AS waiting, COALESCE(q.due, 0) AS due, q.oldest_age,
       p.paused_at, count(*) OVER () AS total
FROM scopes AS s
LEFT JOIN running AS r USING (scope)
LEFT JOIN queued AS q USING (scope)
LEFT JOIN paused AS p USING (scope)
LEFT JOIN limited AS l USING (scope)
WHERE %(search)s::text IS NULL OR strpos(s.scope, %(search)s::text) > 0
ORDER BY r.id IS NULL, p.paused_at IS NULL, COALESCE(q.waiting, 0) DESC, s.scope
LIMIT %(limit)s;

-- name: failures
-- Failed items, most recent first (optionally of one kind), with why and where.
SELECT id, kind, scope, attempt, failures, stalls, worker_id, finished_at, reason, error,
       traceback, count(*) OVER () AS total
FROM /* TEMPLATE: schema */work_items
WHERE status = 'Failed' AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
ORDER BY finished_at DESC, id DESC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: failure_kinds
SELECT kind, count(*) AS n FROM /* TEMPLATE: schema */work_items
WHERE status = 'Failed' GROUP BY kind ORDER BY kind;

-- name: workers
-- Every Worker the table knows, live ones first, with how many items each runs now.
SELECT w.id, w.host, w.pid, w.started_at, w.last_seen, w.stopped_at, w.kinds, w.scopes,
       w.unscoped, w.concurrency,
       EXTRACT(EPOCH FROM now() - w.last_seen)::float8 AS seen_ago,
       w.stopped_at IS NULL AND w.last_seen > now() - make_interval(secs => COALESCE(
           w.advertise_every * %(alive_beats)s, %(alive_within)s)) AS alive,
       COALESCE(r.n, 0) AS running
FROM /* TEMPLATE: schema */work_workers AS w
LEFT JOIN (SELECT worker_id, count(*) AS n FROM /* TEMPLATE: schema */work_items
           WHERE status = 'Running' AND (kind_slot IS NOT NULL OR kind_slot IS NULL)
           GROUP BY worker_id) AS r ON r.worker_id = w.id
ORDER BY alive DESC, w.last_seen DESC, w.id;

-- name: schedules
-- Each schedule, soonest due first, with the status of the item it last enqueued.
SELECT s.name, s.kind, s.scope, s.spec, s.priority, s.next_due, s.last_due, s.last_item,
       s.updated_at, EXTRACT(EPOCH FROM s.next_due - now())::float8 AS due_in,
       i.status AS last_status
FROM /* TEMPLATE: schema */work_schedules AS s
LEFT JOIN /* TEMPLATE: schema */work_items AS i ON i.id = s.last_item
ORDER BY s.next_due, s.name;

-- name: pauses
-- Each pause, with how many Queued items it holds back.
SELECT p.kind, p.scope, p.paused_at,
       EXTRACT(EPOCH FROM now() - p.paused_at)::float8 AS paused_for,
       (SELECT count(*) FROM /* TEMPLATE: schema */work_items AS w
        WHERE w.status = 'Queued' AND (w.kind = p.kind OR w.scope = p.scope)) AS held
FROM /* TEMPLATE: schema */work_pauses AS p
ORDER BY p.paused_at, p.id;

-- name: item
-- payload and trace_context as text: the dashboard decodes them itself (_jsontext), so
-- a value psycopg's JSON loader cannot read (a 5,000-digit number) is shown, not a 500.
-- Its times are read as stored (_reader.AS_STORED), and the spans computed from them
-- only for finite ones (an infinite time cannot be subtracted): a row with a time
-- Python cannot hold is shown too.
SELECT id, kind, scope, payload::text AS payload, trace_context::text AS trace_context,
       priority, status, attempt, stalls, failures, worker_id,
       requested_at, run_after, started_at, finished_at, heartbeat_at, lease_expires_at,
       dedup_key, cancel_requested, reason, error, traceback, result::text AS result,
       CASE WHEN isfinite(run_after) THEN EXTRACT(EPOCH FROM run_after - now())::float8
       END AS due_in,
       CASE WHEN isfinite(lease_expires_at)
            THEN EXTRACT(EPOCH FROM lease_expires_at - now())::float8 END AS lease_left,
       CASE WHEN isfinite(heartbeat_at) THEN EXTRACT(EPOCH FROM now() - heartbeat_at)::float8
       END AS heartbeat_age
FROM /* TEMPLATE: schema */work_items WHERE id = %(id)s;

-- name: item_attempts
-- How each attempt of the item ended (work_attempts), oldest first; the current one,
-- Running or Succeeded, is the item's own row (shown from `item`). Read as stored, as
-- `item` is.
SELECT attempt, worker_id, started_at, ended_at, outcome, error, traceback,
       CASE WHEN isfinite(ended_at) AND isfinite(started_at)
            THEN EXTRACT(EPOCH FROM ended_at - started_at)::float8 END AS took
FROM /* TEMPLATE: schema */work_attempts WHERE item_id = %(id)s
ORDER BY attempt;

-- name: item_steps
-- The item's recorded steps (`ctx.step`), in the order they were recorded; each value
-- as text, decoded by the dashboard, as the payload is. Read as stored, as `item` is.
SELECT name, attempt, recorded_at, result::text AS result
FROM /* TEMPLATE: schema */work_steps WHERE item_id = %(id)s
ORDER BY recorded_at, name;

-- name: item_parents
-- The items it runs after (`after=`; 1,000 at most, as work_items_after_bounded holds),
-- by id, with their statuses.
SELECT p.id, p.kind, p.status
FROM /* TEMPLATE: schema */work_dependencies AS d
    JOIN /* TEMPLATE: schema */work_items AS p ON p.id = d.parent_id
WHERE d.child_id = %(id)s
ORDER BY p.id;

-- name: item_children
-- The items that run after it, by id, up to %(limit)s (a parent may have any number);
-- `total` counts them all. Read from the work_dependencies_children index.
SELECT c.id, c.kind, c.status, count(*) OVER () AS total
FROM /* TEMPLATE: schema */work_dependencies AS d
    JOIN /* TEMPLATE: schema */work_items AS c ON c.id = d.child_id
WHERE d.parent_id = %(id)s
ORDER BY c.id
LIMIT %(limit)s;
