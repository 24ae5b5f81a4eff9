-- Every statement trioworker sends, each under a `-- name:` header.
-- Parameters are psycopg named placeholders; identifiers are never interpolated.
-- Each queue object a statement names comes after the schema marker, a comment:
-- /* TEMPLATE: schema */work_items. The loader (queries.py) puts the queue's schema
-- there ("tenant_a".work_items), or nothing for the search_path to resolve; a test
-- fails for a work_... name without it (tests/unit/test_schema_name.py).
-- The transitions themselves are SQL functions, one each (migrations/0001.queue.sql,
-- section 7), so Python and plain SQL take the same path; writes after a claim are
-- fenced by (id, attempt) there and only touch a Running item.

-- name: enqueue
-- One row, or none when a Queued item already holds the dedup key. The triggers
-- place the item in its scope's line (migrations/0001.queue.sql, section 6), or, with
-- `after`, store it Waiting for its parents (migrations/0003.dependencies.sql).
INSERT INTO /* TEMPLATE: schema */work_items (kind, scope, payload, priority, dedup_key,
                                             run_after, trace_context, after)
VALUES (%(kind)s, %(scope)s, %(payload)s::jsonb, %(priority)s, %(dedup_key)s,
        COALESCE(%(run_at)s, now() + make_interval(secs => %(delay)s)),
        %(trace_context)s::jsonb, %(parents)s::bigint[])
ON CONFLICT (dedup_key) WHERE status = 'Queued' AND dedup_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: enqueue_many
-- Many rows in one statement (one round trip), in order; a row whose dedup key a
-- Queued item (or an earlier row of the batch) holds is not inserted.
-- Each row's parents come as the text of an array ('{12,13}'; NULL: none).
INSERT INTO /* TEMPLATE: schema */work_items (kind, scope, payload, priority, dedup_key,
                                             run_after, trace_context, after)
SELECT kind, scope, payload::jsonb, priority, dedup_key,
       COALESCE(run_at, now() + make_interval(secs => delay)), trace_context::jsonb,
       after::bigint[]
FROM unnest(%(kinds)s::text[], %(scopes)s::text[], %(payloads)s::text[],
            %(priorities)s::integer[], %(dedup_keys)s::text[], %(run_ats)s::timestamptz[],
            %(delays)s::float8[], %(trace_contexts)s::text[], %(parent_lists)s::text[])
     WITH ORDINALITY AS r (kind, scope, payload, priority, dedup_key, run_at, delay,
                           trace_context, after, n)
ORDER BY n
ON CONFLICT (dedup_key) WHERE status = 'Queued' AND dedup_key IS NOT NULL DO NOTHING
RETURNING id, dedup_key;

-- name: unknown_items
-- Which of these ids name no item (an enqueue's `after`, checked before its insert).
SELECT a AS id FROM unnest(%(ids)s::bigint[]) AS a
WHERE NOT EXISTS (SELECT 1 FROM /* TEMPLATE: schema */work_items WHERE id = a)
ORDER BY a;

-- name: queued_with_dedup_keys
SELECT id, dedup_key FROM /* TEMPLATE: schema */work_items
WHERE dedup_key = ANY(%(dedup_keys)s) AND status = 'Queued';

-- name: queued_with_dedup_key
SELECT id FROM /* TEMPLATE: schema */work_items
WHERE dedup_key = %(dedup_key)s AND status = 'Queued';

-- name: claim
-- Up to %(limit)s due items of the served kinds whose scopes and kinds have room under
-- their limits (work_claim_v3, migrations/0005.spent-scopes.sql, which settles the scopes
-- whose rate window has reopened and then claims as work_claim_v2 in
-- 0004.claim-kind-room.sql: a probe of the busy scopes' index and a claim lock per
-- scope; under both work_items_one_running_per_scope_slot and
-- work_items_one_running_per_kind_slot, and work_items_take_slot's refusals
-- work_items_slot_within_limit and work_items_rate_within_limit, whose names the
-- store recognises). For limit 1, the default, a scope runs one item at a time.
-- The payload and trace context come as text, decoded one item at a time, and the
-- store reads requested_at as stored (trioworker/_postgres/as_stored.py): an item whose
-- payload or time Python cannot decode fails on its own (operations.claimed_item), never
-- the batch.
-- The failover guard (work_failover_hold_v1) is asked first: for one lease
-- after the timeline changed, the claim is given no scopes ('{}'), so it takes
-- unscoped items alone.
SELECT id, kind, scope, payload::text AS payload, priority, attempt, stalls, failures,
       requested_at, dedup_key, trace_context::text AS trace_context
FROM /* TEMPLATE: schema */work_claim_v3(
    %(worker_id)s, %(lease)s, %(limit)s, %(kinds)s,
    CASE WHEN /* TEMPLATE: schema */work_failover_hold_v1(%(lease)s) THEN '{}'::text[]
         ELSE %(scopes)s::text[] END,
    %(unscoped)s);

-- name: seconds_until_due
SELECT /* TEMPLATE: schema */work_seconds_until_due_v2(%(kinds)s, %(scopes)s, %(unscoped)s)
    AS seconds;

-- name: heartbeat
-- One attempt's lease, waiting for its row if another transaction holds it (one row
-- back; `lost`: the attempt no longer owns a Running item).
SELECT id, attempt, cancel_requested, lost
FROM /* TEMPLATE: schema */work_heartbeat_v1(ARRAY[%(id)s]::bigint[], ARRAY[%(attempt)s]::integer[],
                                             %(lease)s, true);

-- name: heartbeat_many
-- One statement renews every lease a Worker holds (work_heartbeat_v1): a row another
-- transaction holds (its attempt's fenced transaction, an operator's) is passed over,
-- never waited for (neither renewed nor lost); a cancel asked of a completed attempt
-- is moot.
SELECT id, attempt, cancel_requested, lost
FROM /* TEMPLATE: schema */work_heartbeat_v1(%(ids)s::bigint[], %(attempts)s::integer[], %(lease)s);

-- name: lock_attempt
-- A fenced transaction's first statement, the fence (work_fence_v1): the attempt's row,
-- locked until the commit (a heartbeat of the item passes it over), if the attempt
-- still owns it.
SELECT /* TEMPLATE: schema */work_fence_v1(%(id)s, %(attempt)s) AS fenced;

-- name: complete_in_transaction
-- A fenced transaction's last statement when the handler called `tx.complete()`
-- (work_complete_v1): the attempt's success, noted in the handler's own commit. The row
-- stays Running, holding its slots, until the Worker finishes it Succeeded once the
-- handler has returned, or lease recovery does.
SELECT /* TEMPLATE: schema */work_complete_v1(%(id)s, %(attempt)s) AS completed;

-- name: complete_in_transaction_result
-- complete_in_transaction with the handler's result (`tx.complete(result=...)`), written
-- by work_complete_result_v1 (migrations/0002.results-steps.sql): a Worker may not
-- write the result column itself.
SELECT count(*) = 1 AS completed
FROM /* TEMPLATE: schema */work_complete_result_v1(%(id)s, %(attempt)s, %(result)s::jsonb);

-- name: finish_result
-- Succeeded with the handlers' results (JSON text; NULL: none, or the one its own
-- transaction stored), for many attempts at once; the ids written. The finish is
-- work_finish_v1's; each result is set on the rows it wrote, in the same statement.
SELECT id
FROM /* TEMPLATE: schema */work_finish_result_v1(%(ids)s, %(attempts)s, %(results)s::jsonb[],
                                                 %(wait)s) AS id;

-- name: record_step
-- A step's result, recorded by the attempt in its fenced transaction: 'recorded',
-- 'recorded before' (an earlier attempt's stands) or 'lost' (work_record_step_v1).
SELECT /* TEMPLATE: schema */work_record_step_v1(%(id)s, %(attempt)s, %(name)s, %(result)s::jsonb)
    AS recorded;

-- name: step
-- A step's recorded result, as text; no row: not recorded.
SELECT result::text AS result FROM /* TEMPLATE: schema */work_steps
WHERE item_id = %(id)s AND name = %(name)s;

-- name: parent_results
-- An item's parents and their results (a handler's `ctx.parent_results()`).
SELECT d.parent_id AS id, p.status, p.result::text AS result
FROM /* TEMPLATE: schema */work_dependencies AS d
    JOIN /* TEMPLATE: schema */work_items AS p ON p.id = d.parent_id
WHERE d.child_id = %(id)s
ORDER BY d.parent_id;

-- name: family
-- An item's parents (1,000 at most, by the table's bound) and its first 1,000 children,
-- with their statuses (`show`), parents first.
(SELECT 'parent' AS relation, p.id, p.kind, p.status
 FROM /* TEMPLATE: schema */work_dependencies AS d
     JOIN /* TEMPLATE: schema */work_items AS p ON p.id = d.parent_id
 WHERE d.child_id = %(id)s)
UNION ALL
(SELECT 'child', c.id, c.kind, c.status
 FROM /* TEMPLATE: schema */work_dependencies AS d
     JOIN /* TEMPLATE: schema */work_items AS c ON c.id = d.child_id
 WHERE d.parent_id = %(id)s
 ORDER BY d.child_id LIMIT 1000)
ORDER BY 1 DESC, 2;

-- name: steps
-- An item's recorded steps, in the order they were recorded.
SELECT name, attempt, recorded_at, result::text AS result
FROM /* TEMPLATE: schema */work_steps WHERE item_id = %(id)s
ORDER BY recorded_at, name;

-- name: result_state
-- What waiting for an item's result reads: its status, and its result or why not.
SELECT status, reason, error, result::text AS result FROM /* TEMPLATE: schema */work_items
WHERE id = %(id)s;

-- name: finish
-- Succeeded, Failed or Cancelled, for many attempts at once; the ids written. With
-- wait false, rows another transaction holds are passed over. An attempt that
-- committed its success in its own transaction is only ever finished Succeeded.
SELECT id
FROM /* TEMPLATE: schema */work_finish_v1(%(ids)s, %(attempts)s, %(status)s, %(reason)s, %(error)s,
                                          %(wait)s, %(traceback)s) AS id;

-- name: finish_and_claim
-- A batch of completions finished Succeeded (as `finish` with wait false: rows another
-- transaction holds are passed over) and the next claim, in one round trip when the
-- Worker has free slots (work_finish_and_claim_v3, migrations/0005.spent-scopes.sql: the
-- two transitions, called one after the other in one transaction). The scopes are
-- the claim's, the failover guard asked first, as in `claim`. One row per id finished
-- (`finished`), then one per item claimed, read as `claim` reads them.
SELECT f.finished, (f.item).id, (f.item).kind, (f.item).scope,
       (f.item).payload::text AS payload, (f.item).priority, (f.item).attempt,
       (f.item).stalls, (f.item).failures, (f.item).requested_at, (f.item).dedup_key,
       (f.item).trace_context::text AS trace_context
FROM /* TEMPLATE: schema */work_finish_and_claim_v3(
    %(ids)s, %(attempts)s, %(worker_id)s, %(lease)s, %(limit)s,
    %(kinds)s,
    CASE WHEN /* TEMPLATE: schema */work_failover_hold_v1(%(lease)s) THEN '{}'::text[]
         ELSE %(scopes)s::text[] END,
    %(unscoped)s) AS f;

-- name: requeue
-- Release, or retry after an error: back to Queued, or superseded by a Queued item
-- with the same dedup key ('Running': such an item is being enqueued; try again).
-- An attempt that committed its success in its own transaction is passed over.
SELECT id, status
FROM /* TEMPLATE: schema */work_requeue_v1(%(ids)s, %(attempts)s, %(cause)s, %(delay)s, %(error)s,
                                           %(traceback)s);

-- name: recover_expired_leases
-- With the Worker of each stalled attempt: `held` reads the Running rows as they were
-- when the statement began (its snapshot), before the function took them back. An
-- attempt that committed its success in its own transaction ends Succeeded, no stall.
WITH held AS (
    SELECT id, attempt, worker_id FROM /* TEMPLATE: schema */work_items
    WHERE status = 'Running' AND (kind_slot IS NOT NULL OR kind_slot IS NULL)
      AND lease_expires_at < now()
)
SELECT r.id, r.kind, r.scope, r.attempt, r.stalls, r.status, r.reason, held.worker_id
FROM /* TEMPLATE: schema */work_recover_v1(%(max_stalls)s, %(batch)s) AS r
LEFT JOIN held ON held.id = r.id AND held.attempt = r.attempt;

-- name: held_leases
-- Expired items lease recovery passes over because another session holds their row, a
-- whole lease after their lease ran out (work_held_leases_v1).
SELECT id, kind, scope, attempt, worker_id, expired_for, holder
FROM /* TEMPLATE: schema */work_held_leases_v1(%(limit)s);

-- name: request_cancel
-- NULL for an item already finished, or whose attempt committed its success in its own
-- transaction (work_request_cancel_v2: a Waiting item is cancelled as a Queued one).
SELECT /* TEMPLATE: schema */work_request_cancel_v2(%(id)s) AS status;

-- name: settle_noted_scopes
-- The scopes, and the Waiting items, that a change left to settle (work_settle_noted_v2).
SELECT /* TEMPLATE: schema */work_settle_noted_v2(%(limit)s) AS settled;

-- name: repair_heads
SELECT scope, promoted FROM /* TEMPLATE: schema */work_repair_v2(%(limit)s);

-- name: pause
SELECT /* TEMPLATE: schema */work_pause_v1(%(kind)s, %(scope)s) AS changed;

-- name: resume
SELECT /* TEMPLATE: schema */work_resume_v1(%(kind)s, %(scope)s) AS changed;

-- name: pauses
SELECT kind, scope, paused_at FROM /* TEMPLATE: schema */work_pauses ORDER BY paused_at;

-- name: retry_items
-- Each retry noted in the item's history (`operator-retry`, an attempt number of its
-- own) by the same function (work_retry_v1).
SELECT id FROM /* TEMPLATE: schema */work_retry_v1(%(ids)s) AS id;

-- name: failed_items
-- Failed items of a kind (all kinds when NULL) that finished since %(since)s, oldest first.
SELECT id FROM /* TEMPLATE: schema */work_items
WHERE status = 'Failed' AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND finished_at >= %(since)s
ORDER BY finished_at, id;

-- name: sync_schedule
-- A Worker's schedule, written as it starts: a changed spec starts it afresh.
INSERT INTO /* TEMPLATE: schema */work_schedules AS s
    (name, kind, scope, payload, priority, spec, next_due)
VALUES (%(name)s, %(kind)s, %(scope)s, %(payload)s::jsonb, %(priority)s, %(spec)s,
        %(next_due)s)
ON CONFLICT (name) DO UPDATE
SET kind = excluded.kind, scope = excluded.scope, payload = excluded.payload,
    priority = excluded.priority, spec = excluded.spec, updated_at = now(),
    next_due = CASE WHEN s.spec = excluded.spec THEN s.next_due ELSE excluded.next_due END;

-- name: due_schedules
-- Those of the given schedules (names with the spec this Worker carries) that are due,
-- locked: one another Worker is firing is passed over.
SELECT name, next_due, now() AS now FROM /* TEMPLATE: schema */work_schedules
WHERE (name, spec) IN (SELECT * FROM unnest(%(names)s::text[], %(specs)s::text[]))
  AND next_due <= now()
ORDER BY next_due
FOR UPDATE SKIP LOCKED;

-- name: fired_schedule
UPDATE /* TEMPLATE: schema */work_schedules
SET next_due = %(next_due)s, last_due = %(due)s, last_item = %(item)s, updated_at = now()
WHERE name = %(name)s;

-- name: next_schedule_due
SELECT EXTRACT(EPOCH FROM min(next_due) - now())::float8 AS seconds
FROM /* TEMPLATE: schema */work_schedules
WHERE (name, spec) IN (SELECT * FROM unnest(%(names)s::text[], %(specs)s::text[]));

-- name: schedules
-- By name: a list that keeps its order as due times pass (`status`, the dashboard).
SELECT name, kind, scope, spec, next_due, last_due, last_item
FROM /* TEMPLATE: schema */work_schedules
ORDER BY name;

-- name: status_of
SELECT status FROM /* TEMPLATE: schema */work_items WHERE id = %(id)s;

-- name: delete_finished
-- One bounded batch of retention: the oldest finished items of the given statuses
-- from %(after)s on, read from the work_items_finished index in finished_at order (no
-- scan of the table; the caller passes the last batch's latest finished_at, so rows
-- of other statuses are walked once in all), rows another transaction holds left
-- alone, and so are parents a child still needs; the finished_at of each deleted
-- (work_delete_finished_v2). Their attempt history goes with them.
SELECT finished_at
FROM /* TEMPLATE: schema */work_delete_finished_v2(%(statuses)s, %(after)s, %(older_than)s,
                                                   %(batch)s) AS finished_at;

-- name: count_finished
-- What delete_finished would delete now, counted (`prune --dry-run`).
SELECT count(*) FROM /* TEMPLATE: schema */work_items
WHERE status IN ('Succeeded', 'Failed', 'Cancelled') AND status = ANY(%(statuses)s)
  AND finished_at < now() - make_interval(secs => %(older_than)s);

-- name: kind_seen
-- Whether any Worker ever served the kind (stopped ones stay in work_workers), a
-- schedule enqueues it, or any item has it (`pause --kind` warns of a typo when none
-- has). The items are read last: a kind no Worker knows is rare, and no index leads
-- with kind for items of every status.
SELECT EXISTS (SELECT 1 FROM /* TEMPLATE: schema */work_workers WHERE %(kind)s = ANY(kinds))
    OR EXISTS (SELECT 1 FROM /* TEMPLATE: schema */work_schedules WHERE kind = %(kind)s)
    OR EXISTS (SELECT 1 FROM /* TEMPLATE: schema */work_items WHERE kind = %(kind)s) AS seen;

-- name: kinds_served
-- Each kind any Worker has served (stopped ones stay in work_workers), and whether a
-- live one (alive as `workers` says) serves it now: `enqueue` warns of a kind none does.
SELECT k.kind, bool_or(w.stopped_at IS NULL AND w.last_seen > now() - make_interval(
           secs => COALESCE(w.advertise_every * %(alive_beats)s, %(alive_within)s))) AS live
FROM /* TEMPLATE: schema */work_workers AS w CROSS JOIN LATERAL unnest(w.kinds) AS k (kind)
GROUP BY k.kind;

-- name: scope_holder
-- A scope's Running items, one row each in slot order (quiesce watches them; one row
-- of NULLs: none), and whether any of its Queued items is still a head (none should be
-- once the scope is paused).
SELECT r.id, r.attempt, r.kind, r.worker_id, r.cancel_requested, r.scope_slot AS slot,
       EXTRACT(EPOCH FROM r.lease_expires_at - now())::float8 AS lease_left,
       EXISTS (SELECT 1 FROM /* TEMPLATE: schema */work_items AS h
               WHERE h.scope = %(scope)s AND h.status = 'Queued' AND h.is_head) AS heads
FROM (SELECT 1) AS one
LEFT JOIN /* TEMPLATE: schema */work_items AS r ON r.scope = %(scope)s AND r.status = 'Running'
ORDER BY r.scope_slot, r.id;

-- name: get_item
-- The payload and trace context as text, as the claim reads them.
SELECT id, kind, scope, payload::text AS payload, priority, status, attempt, stalls,
       failures, worker_id, requested_at, run_after, started_at, finished_at, heartbeat_at,
       lease_expires_at, dedup_key, cancel_requested, reason, error, traceback,
       trace_context::text AS trace_context, completed_at, result::text AS result
FROM /* TEMPLATE: schema */work_items WHERE id = %(id)s;

-- name: wait_facts
-- What may hold a Queued item back (reads.WaitFacts; reads.waiting_reasons words it):
-- when it falls due, pauses of its kind and scope, whether a live Worker (alive as
-- `workers` says) serves it, its scope's and its kind's Running items and limits,
-- whether a rate window of its kind or scope has no start left (as `limits` counts),
-- and the due Queued items of its scope that come before it, counted up to 10,000.
-- Read-only, with no function a read-only role could not call; a run_after stored as
-- infinity (by hand) is never due. No row unless the item is Queued: a page that reads
-- it for any item pays the counts only for one that waits.
SELECT CASE WHEN isfinite(w.run_after) THEN EXTRACT(EPOCH FROM w.run_after - now())::float8
            WHEN w.run_after > now() THEN 'Infinity'::float8
            ELSE '-Infinity'::float8 END AS due_in,
       EXISTS (SELECT 1 FROM /* TEMPLATE: schema */work_pauses AS p
               WHERE p.kind = w.kind) AS kind_paused,
       EXISTS (SELECT 1 FROM /* TEMPLATE: schema */work_pauses AS p
               WHERE p.scope = w.scope) AS scope_paused,
       EXISTS (SELECT 1 FROM /* TEMPLATE: schema */work_workers AS k
               WHERE w.kind = ANY(k.kinds) AND k.stopped_at IS NULL
                 AND CASE WHEN w.scope IS NULL THEN k.unscoped
                          ELSE k.scopes IS NULL OR w.scope = ANY(k.scopes) END
                 AND k.last_seen > now() - make_interval(secs => COALESCE(
                     k.advertise_every * %(alive_beats)s, %(alive_within)s))) AS served,
       (SELECT count(*) FROM /* TEMPLATE: schema */work_items AS r
        WHERE r.scope = w.scope AND r.status = 'Running') AS scope_running,
       CASE WHEN w.scope IS NULL THEN 1
            ELSE COALESCE((SELECT l.running FROM /* TEMPLATE: schema */work_limits AS l
                           WHERE l.scope = w.scope),
                          (SELECT l.running FROM /* TEMPLATE: schema */work_limits AS l
                           WHERE l.kind IS NULL AND l.scope IS NULL), 1) END AS scope_limit,
       (SELECT count(*) FROM /* TEMPLATE: schema */work_items AS r
        WHERE r.kind = w.kind AND r.status = 'Running') AS kind_running,
       (SELECT l.running FROM /* TEMPLATE: schema */work_limits AS l
        WHERE l.kind = w.kind) AS kind_limit,
       EXISTS (SELECT 1 FROM /* TEMPLATE: schema */work_limits AS l
               WHERE (l.kind = w.kind OR l.scope = w.scope) AND l.rate IS NOT NULL
                 AND (SELECT count(*) FROM /* TEMPLATE: schema */work_rate_slots AS s
                      WHERE s.limit_id = l.id AND s.started_at > now() - l.per) >= l.rate)
           AS rate_spent,
       (SELECT count(*) FROM (
            SELECT 1 FROM /* TEMPLATE: schema */work_items AS a
            WHERE a.scope = w.scope AND a.status = 'Queued' AND a.run_after <= now()
              AND a.id <> w.id
              AND (a.priority > w.priority
                   OR (a.priority = w.priority AND (a.run_after, a.id) < (w.run_after, w.id)))
            LIMIT 10000) AS before) AS ahead
FROM /* TEMPLATE: schema */work_items AS w WHERE w.id = %(id)s AND w.status = 'Queued';

-- name: attempts
-- How each attempt of an item ended: the noted ones (work_attempts), and the item's
-- current attempt when it is running or succeeded.
SELECT attempt, worker_id, started_at, ended_at, outcome, error, traceback FROM (
    SELECT attempt, worker_id, started_at, ended_at, outcome, error, traceback
    FROM /* TEMPLATE: schema */work_attempts WHERE item_id = %(id)s
    UNION ALL
    SELECT w.attempt, w.worker_id, w.started_at, w.finished_at,
           CASE w.status WHEN 'Succeeded' THEN 'succeeded' ELSE 'running' END, NULL, NULL
    FROM /* TEMPLATE: schema */work_items AS w
    WHERE w.id = %(id)s AND w.status IN ('Succeeded', 'Running') AND w.attempt > 0
      AND NOT EXISTS (SELECT 1 FROM /* TEMPLATE: schema */work_attempts AS a
                      WHERE a.item_id = w.id AND a.attempt = w.attempt)
) AS history
ORDER BY attempt;

-- name: advertise_worker
-- Record or refresh a Worker. An id another process holds (its row not stopped, and
-- alive by its own interval) is not taken over: no row comes back; unless that process
-- is %(gone_pid)s on this Worker's host, which the caller has seen is no longer running
-- (a Worker restarted after a crash). A Worker back under its id (a restart, a new
-- process) starts afresh: a new started_at.
INSERT INTO /* TEMPLATE: schema */work_workers AS w
    (id, host, pid, kinds, scopes, unscoped, concurrency, advertise_every)
VALUES (%(id)s, %(host)s, %(pid)s, %(kinds)s, %(scopes)s, %(unscoped)s, %(concurrency)s,
        %(advertise_every)s)
ON CONFLICT (id) DO UPDATE
SET host = excluded.host, pid = excluded.pid, kinds = excluded.kinds,
    scopes = excluded.scopes, unscoped = excluded.unscoped,
    concurrency = excluded.concurrency, advertise_every = excluded.advertise_every,
    last_seen = now(), stopped_at = NULL,
    started_at = CASE WHEN w.stopped_at IS NULL AND w.host = excluded.host
                           AND w.pid = excluded.pid THEN w.started_at ELSE now() END
WHERE (w.host = excluded.host AND w.pid IN (excluded.pid, %(gone_pid)s))
   OR w.stopped_at IS NOT NULL
   OR w.last_seen <= now() - make_interval(secs => COALESCE(
          w.advertise_every * %(alive_beats)s, %(alive_within)s))
RETURNING w.id;

-- name: worker_holding
-- The live Worker that holds an id (advertise_worker refused it).
SELECT host, pid, EXTRACT(EPOCH FROM now() - last_seen)::float8 AS seen_ago
FROM /* TEMPLATE: schema */work_workers WHERE id = %(id)s;

-- name: worker_stopped
UPDATE /* TEMPLATE: schema */work_workers SET last_seen = now(), stopped_at = now()
WHERE id = %(id)s;

-- name: counts_by_kind_and_status
SELECT kind, status, count(*) AS n FROM /* TEMPLATE: schema */work_items
GROUP BY kind, status ORDER BY kind, status;

-- name: running_items
-- Every Running row, from the kind slots' index and the unslotted kinds' (each arm of
-- the OR matches one: no index holds every Running row).
SELECT id, kind, scope, attempt, worker_id, started_at,
       EXTRACT(EPOCH FROM lease_expires_at - now())::float8 AS lease_left
FROM /* TEMPLATE: schema */work_items
WHERE status = 'Running' AND (kind_slot IS NOT NULL OR kind_slot IS NULL)
ORDER BY started_at;

-- name: busy_scopes
-- Scopes with a Running item (a scope whose limit is over one may run several).
SELECT count(DISTINCT scope) AS n FROM /* TEMPLATE: schema */work_items
WHERE status = 'Running' AND scope IS NOT NULL;

-- name: recent_failures
SELECT id, kind, scope, attempt, finished_at, reason, error
FROM /* TEMPLATE: schema */work_items WHERE status = 'Failed'
ORDER BY finished_at DESC LIMIT %(limit)s;

-- name: workers
SELECT id, host, pid, started_at, last_seen, stopped_at, kinds, scopes, unscoped,
       concurrency,
       stopped_at IS NULL AND last_seen > now() - make_interval(secs => COALESCE(
           advertise_every * %(alive_beats)s, %(alive_within)s)) AS alive
FROM /* TEMPLATE: schema */work_workers
ORDER BY stopped_at IS NOT NULL, last_seen DESC;

-- name: unserved_kinds
-- Kinds with Queued items that no live Worker serves (alive as `workers` says).
SELECT q.kind, q.n
FROM (SELECT kind, count(*) AS n FROM /* TEMPLATE: schema */work_items
      WHERE status = 'Queued' GROUP BY kind) AS q
WHERE NOT EXISTS (
    SELECT 1 FROM /* TEMPLATE: schema */work_workers AS w
    WHERE q.kind = ANY(w.kinds) AND w.stopped_at IS NULL
      AND w.last_seen > now() - make_interval(secs => COALESCE(
          w.advertise_every * %(alive_beats)s, %(alive_within)s)))
ORDER BY q.kind;

-- name: channels
-- The NOTIFY channels of the queue's schema (work_channel):
-- trioworker and trioworker_settle in public, suffixed by the schema's name elsewhere.
SELECT /* TEMPLATE: schema */work_channel('trioworker') AS notify,
       /* TEMPLATE: schema */work_channel('trioworker_settle') AS settle;

-- name: listen
-- The one statement with an identifier filled in: {channel}, by psycopg.sql.Identifier.
LISTEN {channel};

-- name: listen_probe
-- The listener proves that notifications reach its connection (a transaction pooler
-- such as PgBouncer would hand them to no one): it listens here, a pooled connection
-- notifies, and the probe must arrive.
LISTEN trioworker_probe;

-- name: notify_probe
SELECT pg_notify('trioworker_probe', '');

-- name: unlisten_probe
UNLISTEN trioworker_probe;

-- -- limits (docs/design/limits.md) --------------------------------------------------------

-- name: set_limit
-- NULL keeps what is set; the row as it now is (none: the limit was removed).
SELECT kind, scope, running, rate, EXTRACT(EPOCH FROM per)::float8 AS per, updated_at
FROM /* TEMPLATE: schema */work_set_limit_v1(%(kind)s, %(scope)s, %(running)s, %(rate)s, %(per)s);

-- name: declare_limit
-- A kind's limit as its handler declares it (work_declare_limit_v1): what it held
-- before, and whether it was written.
SELECT running, rate, per, written
FROM /* TEMPLATE: schema */work_declare_limit_v1(%(kind)s, %(running)s, %(rate)s, %(per)s);

-- name: clear_limit
SELECT /* TEMPLATE: schema */work_clear_limit_v1(%(kind)s, %(scope)s) AS cleared;

-- name: limits
-- Every limit, with what it holds now: the Running items it covers, the starts in its
-- current rate window, and the due Queued items it holds back while it is full (counted
-- up to 100000; for the default, in scopes at the default limit, not counted).
SELECT l.kind, l.scope, l.running, l.rate, EXTRACT(EPOCH FROM l.per)::float8 AS per,
       l.updated_at, u.in_use, w.started_in_window,
       CASE WHEN (l.running IS NOT NULL AND u.in_use >= l.running)
                 OR (l.rate IS NOT NULL AND w.started_in_window >= l.rate)
            THEN (SELECT count(*) FROM (
                      SELECT 1 FROM /* TEMPLATE: schema */work_items AS q
                      WHERE q.status = 'Queued' AND q.run_after <= now()
                        AND (q.kind = l.kind OR q.scope = l.scope)
                      LIMIT 100000) AS due)
            ELSE 0 END AS waiting
FROM /* TEMPLATE: schema */work_limits AS l
CROSS JOIN LATERAL (
    SELECT CASE
        WHEN l.kind IS NOT NULL THEN
            (SELECT count(*) FROM /* TEMPLATE: schema */work_items AS r
             WHERE r.kind = l.kind AND r.status = 'Running')
        WHEN l.scope IS NOT NULL THEN
            (SELECT count(*) FROM /* TEMPLATE: schema */work_items AS r
             WHERE r.scope = l.scope AND r.status = 'Running')
        ELSE (SELECT count(*) FROM /* TEMPLATE: schema */work_items AS r
              WHERE r.status = 'Running' AND r.scope IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM /* TEMPLATE: schema */work_limits AS o
                                WHERE o.scope = r.scope AND o.running IS NOT NULL))
    END AS in_use) AS u
CROSS JOIN LATERAL (
    SELECT count(*) AS started_in_window FROM /* TEMPLATE: schema */work_rate_slots AS s
    WHERE s.limit_id = l.id AND s.started_at > now() - l.per) AS w
ORDER BY l.kind IS NULL, l.kind, l.scope IS NULL, l.scope;
