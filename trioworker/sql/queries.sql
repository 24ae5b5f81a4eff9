-- Every statement trioworker sends, each under a `-- name:` header.
-- Parameters are psycopg named placeholders; identifiers are never interpolated. The
-- claim's batch size is a constant, filled in by psycopg.sql as a literal: with a
-- parameter there PostgreSQL can neither estimate the LIMIT nor reuse a plan.
-- Writes after the claim are fenced by (id, attempt) and only touch a Running item.

-- name: enqueue
-- One row, or none when a Queued item already holds the dedup key.
INSERT INTO work_items (kind, scope, payload, dedup_key, run_after)
VALUES (%(kind)s, %(scope)s, %(payload)s::jsonb, %(dedup_key)s,
        COALESCE(%(run_at)s, now() + make_interval(secs => %(delay)s)))
ON CONFLICT (dedup_key) WHERE status = 'Queued' AND dedup_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: queued_with_dedup_key
SELECT id FROM work_items WHERE dedup_key = %(dedup_key)s AND status = 'Queued';

-- name: claim
-- Claim the oldest due candidates (a batch of a constant size), locking each and
-- skipping those another claim holds. The candidates come from one of the
-- `candidates*` queries below, as the Worker serves every scope or a list of them
-- (see claim_statement in the store). No braces in comments here: psycopg.sql fills
-- the two placeholders below.
WITH candidate AS (
    {candidates}
    ORDER BY w.run_after, w.id
    LIMIT {limit}
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
RETURNING w.id, w.kind, w.scope, w.payload, w.attempt, w.stalls, w.failures,
          w.requested_at, w.dedup_key;

-- name: candidates
-- Due Queued items whose scopes have nothing Running. Candidates are unscoped items
-- and scope heads (migration 0002), so busy scopes' backlogs are never read, and a
-- batch never holds two items of one scope (a scope has one head at most). Two claims
-- of one scope that slip past NOT EXISTS collide on work_items_one_running_per_scope;
-- the loser gets nothing (see the store).
SELECT w.id
FROM work_items AS w
WHERE w.status = 'Queued'
  AND (w.scope IS NULL OR w.is_head)
  AND w.run_after <= now()
  AND (w.scope IS NULL OR NOT EXISTS (
        SELECT 1 FROM work_items AS r
        WHERE r.scope = w.scope AND r.status = 'Running'))

-- name: candidates_in_scopes
-- As candidates, for a Worker that serves only the listed scopes.
SELECT w.id
FROM work_items AS w
WHERE w.status = 'Queued'
  AND (w.scope IS NULL OR w.is_head)
  AND w.scope = ANY(%(scopes)s::text[])
  AND w.run_after <= now()
  AND NOT EXISTS (
        SELECT 1 FROM work_items AS r
        WHERE r.scope = w.scope AND r.status = 'Running')

-- name: candidates_in_scopes_or_unscoped
-- As candidates, for a Worker that serves the listed scopes and unscoped items.
SELECT w.id
FROM work_items AS w
WHERE w.status = 'Queued'
  AND (w.scope IS NULL OR w.is_head)
  AND (w.scope IS NULL OR w.scope = ANY(%(scopes)s::text[]))
  AND w.run_after <= now()
  AND (w.scope IS NULL OR NOT EXISTS (
        SELECT 1 FROM work_items AS r
        WHERE r.scope = w.scope AND r.status = 'Running'))

-- name: candidates_without_scope_rule
-- TEST ONLY (TRIOWORKER_TEST_SCOPE_RULE_OFF=1): every due Queued item, scope or not,
-- so the chaos test can show that its checks catch overlapping attempts.
SELECT w.id
FROM work_items AS w
WHERE w.status = 'Queued' AND w.run_after <= now()

-- name: seconds_until_due
-- How long until the next candidate that is not due yet becomes due (NULL: none).
SELECT EXTRACT(EPOCH FROM min(run_after) - now())::float8 AS seconds
FROM work_items
WHERE status = 'Queued' AND (scope IS NULL OR is_head) AND run_after > now();

-- name: heartbeat
UPDATE work_items
SET lease_expires_at = now() + make_interval(secs => %(lease)s),
    heartbeat_at = now()
WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'Running'
RETURNING cancel_requested;

-- name: complete
UPDATE work_items
SET status = 'Succeeded', finished_at = now(), lease_expires_at = NULL
WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'Running'
RETURNING id;

-- name: complete_batch
-- complete for many attempts in one statement (the Worker's completion batcher).
UPDATE work_items AS w
SET status = 'Succeeded', finished_at = now(), lease_expires_at = NULL
FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS done(id, attempt)
WHERE w.id = done.id AND w.attempt = done.attempt AND w.status = 'Running'
RETURNING w.id;

-- name: fail
UPDATE work_items
SET status = 'Failed', finished_at = now(), lease_expires_at = NULL,
    reason = %(reason)s, error = %(error)s, failures = failures + 1
WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'Running'
RETURNING id;

-- name: cancel
UPDATE work_items
SET status = 'Cancelled', finished_at = now(), lease_expires_at = NULL,
    reason = 'cancel requested'
WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'Running'
RETURNING id;

-- name: release
-- Back to Queued at its old place in line; not a stall, not a failure. When a Queued
-- sibling already holds its dedup key, that sibling does the work and this item is
-- superseded (a requeue must never wedge on the dedup index).
WITH superseded AS (
    SELECT 'superseded by queued item ' || q.id AS reason
    FROM work_items AS me
    JOIN work_items AS q ON q.dedup_key = me.dedup_key AND q.status = 'Queued'
    WHERE me.id = %(id)s
)
UPDATE work_items AS w
SET status = CASE WHEN EXISTS (SELECT FROM superseded) THEN 'Cancelled' ELSE 'Queued' END,
    reason = COALESCE((SELECT reason FROM superseded), w.reason),
    finished_at = CASE WHEN EXISTS (SELECT FROM superseded) THEN now() END,
    worker_id = NULL, lease_expires_at = NULL
WHERE w.id = %(id)s AND w.attempt = %(attempt)s AND w.status = 'Running'
RETURNING w.status;

-- name: retry_later
-- Back to Queued after a handler error, due again in %(delay)s seconds; superseded
-- like a release when a Queued sibling holds its dedup key.
WITH superseded AS (
    SELECT 'superseded by queued item ' || q.id AS reason
    FROM work_items AS me
    JOIN work_items AS q ON q.dedup_key = me.dedup_key AND q.status = 'Queued'
    WHERE me.id = %(id)s
)
UPDATE work_items AS w
SET status = CASE WHEN EXISTS (SELECT FROM superseded) THEN 'Cancelled' ELSE 'Queued' END,
    reason = (SELECT reason FROM superseded),
    finished_at = CASE WHEN EXISTS (SELECT FROM superseded) THEN now() END,
    run_after = now() + make_interval(secs => %(delay)s),
    error = %(error)s, failures = w.failures + 1,
    worker_id = NULL, lease_expires_at = NULL
WHERE w.id = %(id)s AND w.attempt = %(attempt)s AND w.status = 'Running'
RETURNING w.status;

-- name: recover_expired_leases
-- Requeue Running items whose lease has expired and count a stall; the stall that
-- reaches max_stalls fails the item. The lease is checked again on the locked row, so
-- an item whose lease was renewed meanwhile is left alone. A requeue that would meet
-- a Queued sibling with the same dedup key is superseded by it instead of wedging,
-- and a stalled item whose cancel was requested is cancelled.
WITH expired AS (
    SELECT id FROM work_items
    WHERE status = 'Running' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), decided AS (
    SELECT w.id,
           CASE WHEN w.stalls + 1 >= %(max_stalls)s THEN 'Failed'
                WHEN w.cancel_requested THEN 'Cancelled'
                WHEN s.id IS NOT NULL THEN 'Cancelled'
                ELSE 'Queued' END AS status,
           CASE WHEN w.stalls + 1 >= %(max_stalls)s THEN 'stalled'
                WHEN w.cancel_requested THEN 'cancel requested'
                WHEN s.id IS NOT NULL THEN 'superseded by queued item ' || s.id
                ELSE NULL END AS reason
    FROM expired
    JOIN work_items AS w ON w.id = expired.id
    LEFT JOIN LATERAL (
        SELECT q.id FROM work_items AS q
        WHERE q.dedup_key = w.dedup_key AND q.status = 'Queued'
    ) AS s ON true
)
UPDATE work_items AS w
SET status = decided.status,
    stalls = w.stalls + 1,
    reason = COALESCE(decided.reason, w.reason),
    finished_at = CASE WHEN decided.status = 'Queued' THEN NULL ELSE now() END,
    worker_id = NULL, lease_expires_at = NULL
FROM decided
WHERE w.id = decided.id AND w.status = 'Running' AND w.lease_expires_at < now()
RETURNING w.id, w.kind, w.scope, w.attempt, w.stalls, w.status, w.reason;

-- name: request_cancel
-- A Queued item is cancelled at once; a Running one is asked to stop (its next
-- heartbeat reports CancelRequested).
UPDATE work_items
SET status = CASE WHEN status = 'Queued' THEN 'Cancelled' ELSE status END,
    finished_at = CASE WHEN status = 'Queued' THEN now() ELSE finished_at END,
    reason = CASE WHEN status = 'Queued' THEN 'cancelled before it ran' ELSE reason END,
    cancel_requested = true
WHERE id = %(id)s AND status IN ('Queued', 'Running')
RETURNING status;

-- name: status_of
SELECT status FROM work_items WHERE id = %(id)s;

-- name: delete_finished
WITH doomed AS (
    SELECT id FROM work_items
    WHERE status IN ('Succeeded', 'Failed', 'Cancelled')
      AND finished_at < now() - make_interval(secs => %(older_than)s)
    ORDER BY finished_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM work_items AS w USING doomed WHERE w.id = doomed.id;

-- name: get_item
SELECT id, kind, scope, payload, status, attempt, stalls, failures, worker_id,
       requested_at, run_after, started_at, finished_at, heartbeat_at, lease_expires_at,
       dedup_key, cancel_requested, reason, error
FROM work_items WHERE id = %(id)s;

-- name: counts_by_kind_and_status
SELECT kind, status, count(*) AS n FROM work_items GROUP BY kind, status ORDER BY kind, status;

-- name: running_items
SELECT id, kind, scope, attempt, worker_id, started_at,
       EXTRACT(EPOCH FROM lease_expires_at - now())::float8 AS lease_left
FROM work_items WHERE status = 'Running' ORDER BY started_at;

-- name: busy_scopes
SELECT count(*) AS n FROM work_items WHERE status = 'Running' AND scope IS NOT NULL;

-- name: recent_failures
SELECT id, kind, scope, attempt, finished_at, reason, error
FROM work_items WHERE status = 'Failed'
ORDER BY finished_at DESC LIMIT %(limit)s;

-- name: listen
LISTEN trioworker;
