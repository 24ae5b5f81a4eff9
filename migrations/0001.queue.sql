-- The queue's schema, in one file: its tables, their indexes, the triggers that keep an
-- item's place in its scope's line, and every transition of a work item, each one
-- function that every path calls (the Worker through trioworker/_postgres/queries.sql,
-- an operator's CLI, plain SQL). Read it top to bottom:
--
--   1. tables, each with its constraints: what any writer may store;
--   2. indexes, each with the statement that reads it;
--   3. plumbing: the schema's NOTIFY channels, pinning, the queue's own locks;
--   4. heads: how the first Queued item of each line of a free scope is kept a head;
--   5. limits: slots and rate slots, held where a row becomes Running;
--   6. triggers: what every writer's INSERT, UPDATE or DELETE sets off;
--   7. the transitions: claim, heartbeat, the fence, finish, requeue, recovery, cancel,
--      retry, pause and resume, limits, settle and repair, retention.
--
-- This is the first release's baseline (issue 32): the schema a database built by the
-- pre-release chain of migrations (0001.baseline .. 0011.roles, then 0013.free-scopes:
-- a scope's Running items found through its slots alone) had, written again as one
-- file, with every public transition at one version, work_NAME_v1. From here it is
-- append-only: a change is a new migration, and a changed entry point a new _vN beside
-- the old one, never an old one redefined in place nor aliased to a newer one (ADR 0009).
--
-- The rule (docs/design/claim.md): a scope runs at most its running limit of items at
-- once (1 by default), held by the schema (a unique index over the rows holding a scope
-- slot, and the work_items_take_slot trigger), whoever writes. Heads make the claim
-- cheap: the first Queued item of each line (scope, kind, priority) of a free scope is
-- a head; a busy or paused scope has none. An extra head is harmless (the slot index
-- and the claim's locks hold the rule); a missing one would leave due work unclaimed, a
-- wedge.
--
-- Two parties change lines, and they never wait on each other:
--
-- * the queue's own transitions (the functions of section 7) run in short transactions
--   of their own and settle a scope's heads under the scope's settle lock (a row of
--   work_settle_locks, taken with a bounded wait). They set trioworker.internal so the
--   triggers leave their rows alone.
-- * Everyone else (an enqueue, COPY, an operator's UPDATE or DELETE, in any transaction
--   at any isolation level) is seen by triggers that take no lock and wait on nothing.
--   An item arriving in a line becomes a head unless something certainly goes before
--   it; at commit, an item placed behind checks that this is still so while it holds
--   the settle lock shared (try only, never waiting), so the next settle of that scope
--   cannot start before the commit and will see it. A head or Running item changed or
--   deleted by hand leaves its scope in work_unsettled_scopes, which Workers settle on
--   NOTIFY and every poll.
--
-- The queue takes no advisory lock (advisory keys are the whole database's: any role
-- that can connect could hold them); its locks are rows of its own tables, which a role
-- needs grants to lock (section 3).
--
-- The transitions plan their statements once per session (generic plans: planning
-- these costs more than running them), never JIT-compile them, and never scan the
-- table: every statement here has an index to read, and a plan made while the table was
-- small must not keep a sequential scan once it is large.
--
-- Who may call what: each transition runs as the schema's owner (SECURITY DEFINER,
-- work_secure_transitions, run after every `migrate` by post-apply.secure-transitions.sql)
-- and EXECUTE on it is the right to make it; docs/grants.sql gives it per role
-- (docs/roles.md).
-- depends:

-- =====================================================================================
-- 1. Tables
-- =====================================================================================

-- A kind, scope or dedup key that is only whitespace is refused, as every Python path
-- refuses it (str.strip, whose whitespace is exactly this class: the test compares them
-- character by character): an item of a blank kind could never be served, since a
-- Registry takes no such kind. (Here, before the tables: work_limits' CHECK calls it,
-- and work_items_asked_in_bounds.)
CREATE FUNCTION work_not_blank(p_name text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN p_name ~ '[^\u0009-\u000d\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]';

-- One row per piece of work, from its enqueue to its retention's delete. Times are
-- finite, from 1900 to 9000 (UTC), and the counters bounded, by the triggers of section
-- 6 (work_items_*_times_in_range, work_items_counters_bounded): CHECKs would be prepared
-- again on every UPDATE (docs/design/schema.md, "Bounds"). So is what an enqueue asks
-- for, which no transition writes (the names, the priority, the payload, the trace
-- context): one trigger, work_items_asked_in_bounds, refuses it by the bound's name.
CREATE TABLE work_items (
    id               bigint      GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    kind             text        NOT NULL,
    scope            text,
    payload          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- Higher runs sooner: due items are claimed in (priority DESC, run_after, id) order.
    priority         integer     NOT NULL DEFAULT 0,
    status           text        NOT NULL DEFAULT 'Queued',
    requested_at     timestamptz NOT NULL DEFAULT now(),
    run_after        timestamptz NOT NULL DEFAULT now(),
    attempt          integer     NOT NULL DEFAULT 0,
    stalls           integer     NOT NULL DEFAULT 0,
    failures         integer     NOT NULL DEFAULT 0,
    worker_id        text,
    lease_expires_at timestamptz,
    heartbeat_at     timestamptz,
    started_at       timestamptz,
    finished_at      timestamptz,
    dedup_key        text,
    cancel_requested boolean     NOT NULL DEFAULT false,
    reason           text,
    error            text,
    -- The last failed attempt's traceback (its tail, at most 16 KiB).
    traceback        text,
    -- Kept by the functions and triggers below: true on the first Queued item of each
    -- line of a free scope (and, for a moment, on a few more: an extra head is
    -- harmless, a missing one is not).
    is_head          boolean     NOT NULL DEFAULT false,
    -- The trace context it was enqueued in (docs/adr/0010-tracing.md): the carrier an
    -- OpenTelemetry propagator wrote, {"traceparent": "00-...", "tracestate": "..."}
    -- for W3C trace context, so each attempt's span joins the request that asked for
    -- the work. NULL when there was none. Any writer may set it; plain SQL too.
    trace_context    jsonb,
    -- The slots a Running item holds (NULL while not Running; a kind slot only for a
    -- kind with a running limit): see work_items_take_slot.
    scope_slot       integer,
    kind_slot        integer,
    -- When the attempt committed its success in its own fenced transaction
    -- (work_complete_v1; NULL: it did not). The row stays Running, holding its slots,
    -- until the Worker finishes it Succeeded once the handler has returned, or lease
    -- recovery does; nothing else may end it (docs/design/claim.md).
    completed_at     timestamptz,
    CONSTRAINT work_items_status_known
        CHECK (status IN ('Queued', 'Running', 'Succeeded', 'Failed', 'Cancelled')),
    CONSTRAINT work_items_traceback_fits CHECK (length(traceback) <= 20000),
    -- Below zero; the upper bound is work_items_counters_bounded's.
    CONSTRAINT work_items_counters_sane CHECK (attempt >= 0 AND stalls >= 0 AND failures >= 0),
    CONSTRAINT work_items_running_has_lease
        CHECK ((status = 'Running') = (lease_expires_at IS NOT NULL)),
    CONSTRAINT work_items_heads_are_queued_and_scoped
        CHECK (NOT is_head OR (status = 'Queued' AND scope IS NOT NULL)),
    CONSTRAINT work_items_slots_only_running
        CHECK (status = 'Running' OR (scope_slot IS NULL AND kind_slot IS NULL)),
    -- A completed row can become Succeeded and nothing else, whoever writes.
    CONSTRAINT work_items_completed_only_running_or_succeeded
        CHECK (completed_at IS NULL OR status IN ('Running', 'Succeeded'))
);

-- How each attempt that did not succeed ended: a short history per item (its last 20
-- such attempts), for `python -m trioworker show ID`. A succeeded attempt is the
-- item's own row (started_at, finished_at, worker_id).
CREATE TABLE work_attempts (
    item_id    bigint      NOT NULL REFERENCES work_items (id) ON DELETE CASCADE,
    attempt    integer     NOT NULL,
    worker_id  text,
    started_at timestamptz,
    ended_at   timestamptz NOT NULL DEFAULT now(),
    -- failed, retried, released, stalled, cancelled, superseded, operator-retry
    outcome    text        NOT NULL,
    error      text,
    traceback  text,
    PRIMARY KEY (item_id, attempt),
    CONSTRAINT work_attempts_times_in_range
        CHECK (LEAST(started_at, ended_at) >= '1900-01-01 00:00:00+00'
               AND GREATEST(started_at, ended_at) <= '9000-01-01 00:00:00+00')
);

-- Scopes whose heads must be settled again: left by a change made by hand (a head or
-- Running item deleted or edited outside trioworker), or by a settle that met a row
-- another transaction held. Workers settle them at once on NOTIFY, and every poll.
CREATE TABLE work_unsettled_scopes (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope    text        NOT NULL,
    noted_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT work_unsettled_scopes_times_in_range
        CHECK (noted_at BETWEEN '1900-01-01 00:00:00+00' AND '9000-01-01 00:00:00+00')
);

-- Paused work: a kind, or a scope, that no claim takes until it is resumed.
CREATE TABLE work_pauses (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind      text,
    scope     text,
    paused_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT work_pauses_one_target CHECK ((kind IS NULL) <> (scope IS NULL)),
    CONSTRAINT work_pauses_times_in_range
        CHECK (paused_at BETWEEN '1900-01-01 00:00:00+00' AND '9000-01-01 00:00:00+00')
);

-- The Workers, live and stopped: each advertises itself every `advertise_every` seconds.
CREATE TABLE work_workers (
    id              text             PRIMARY KEY,
    host            text             NOT NULL,
    pid             integer          NOT NULL,
    started_at      timestamptz      NOT NULL DEFAULT now(),
    last_seen       timestamptz      NOT NULL DEFAULT now(),
    stopped_at      timestamptz,
    kinds           text[]           NOT NULL,
    scopes          text[],          -- NULL: every scope
    unscoped        boolean          NOT NULL,
    concurrency     integer          NOT NULL,
    -- NULL: a Worker that does not say, judged alive by a fixed window.
    advertise_every double precision,
    CONSTRAINT work_workers_times_in_range
        CHECK (LEAST(started_at, last_seen, stopped_at) >= '1900-01-01 00:00:00+00'
               AND GREATEST(started_at, last_seen, stopped_at) <= '9000-01-01 00:00:00+00'),
    -- (NaN is above every number in PostgreSQL's order, so `<=` refuses it, as Infinity.)
    CONSTRAINT work_workers_advertise_every_sane
        CHECK (advertise_every > 0 AND advertise_every <= 604800)
);

-- Each schedule's next due time, held by the database: a Worker that finds it past
-- locks the row (SKIP LOCKED: another Worker is already firing it), enqueues one item
-- for the most recent due time, and moves it on, all in one transaction. Workers that
-- carry a schedule write its definition here when they start; a changed definition
-- (spec) starts it afresh.
CREATE TABLE work_schedules (
    name       text        PRIMARY KEY,
    kind       text        NOT NULL,
    scope      text,
    payload    jsonb       NOT NULL DEFAULT '{}'::jsonb,
    priority   integer     NOT NULL DEFAULT 0,
    spec       text        NOT NULL,
    next_due   timestamptz NOT NULL,
    last_due   timestamptz,
    last_item  bigint,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT work_schedules_payload_depth
        CHECK (NOT jsonb_path_exists(payload, 'strict $.**{64}')),
    CONSTRAINT work_schedules_times_in_range
        CHECK (LEAST(next_due, last_due, updated_at) >= '1900-01-01 00:00:00+00'
               AND GREATEST(next_due, last_due, updated_at) <= '9000-01-01 00:00:00+00')
);

-- A limit (docs/design/limits.md) for a kind, for a scope, or (neither) the default
-- running limit of every scope that has no running limit of its own. Plain SQL may
-- write it; trioworker's way is work_set_limit_v1.
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
        CHECK (kind IS NOT NULL OR scope IS NOT NULL OR rate IS NULL),
    CONSTRAINT work_limits_times_in_range
        CHECK (updated_at BETWEEN '1900-01-01 00:00:00+00' AND '9000-01-01 00:00:00+00')
);

-- A rate limit's windows: one row per start it allows in a period, holding the time of
-- the last start that used it ('-infinity': never used). Kept by work_limits_changed. A
-- start takes a row whose start is at least a period old, so no window of one period
-- holds more than `rate` starts.
CREATE TABLE work_rate_slots (
    limit_id   bigint      NOT NULL REFERENCES work_limits (id) ON DELETE CASCADE,
    slot       integer     NOT NULL,
    started_at timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (limit_id, slot),
    CONSTRAINT work_rate_slots_times_in_range
        CHECK (started_at = '-infinity'
               OR started_at BETWEEN '1900-01-01 00:00:00+00' AND '9000-01-01 00:00:00+00')
);

-- The failover guard (docs/design/failover.md, ADR 0012), one row: the timeline the
-- last claims ran on, the longest lease a claim has taken, and until when claims of
-- scoped work wait ('-infinity': they do not). Its one row is inserted in section 7,
-- once work_timeline exists.
CREATE TABLE work_failover_guard (
    singleton  boolean          PRIMARY KEY DEFAULT true CHECK (singleton),
    timeline   bigint           NOT NULL,
    lease      double precision NOT NULL DEFAULT 0 CHECK (lease >= 0),
    held_until timestamptz      NOT NULL DEFAULT '-infinity',
    CONSTRAINT work_failover_guard_times_in_range
        CHECK (held_until = '-infinity'
               OR held_until BETWEEN '1900-01-01 00:00:00+00' AND '9000-01-01 00:00:00+00'),
    CONSTRAINT work_failover_guard_lease_sane CHECK (lease <= 604800)
);

-- The queue's own locks (docs/design/claim.md, "Locks"): a scope's settle lock and its
-- claim lock are the rows of its stripe (work_stripe) in these two tables. Locking a
-- row needs UPDATE on its table, which only the transitions (running as the owner)
-- have; an advisory key any role could hold. Stripes, not a row per scope: the rows
-- exist before any scope does, so no enqueue writes one. One row per stripe, only ever
-- locked: the schema refuses a change or removal by name (work_lock_rows_stay).
CREATE TABLE work_settle_locks (
    stripe integer PRIMARY KEY CHECK (stripe BETWEEN 0 AND 16383)
);
INSERT INTO work_settle_locks (stripe) SELECT g FROM generate_series(0, 16383) AS g;

CREATE TABLE work_claim_locks (
    stripe integer PRIMARY KEY CHECK (stripe BETWEEN 0 AND 16383)
);
INSERT INTO work_claim_locks (stripe) SELECT g FROM generate_series(0, 16383) AS g;

-- =====================================================================================
-- 2. Indexes, each with what reads it (every index an item's write maintains costs
--    each enqueue, claim and finish: docs/benchmarks.md)
-- =====================================================================================

-- The rule as a schema invariant: each slot of a scope held by one Running item at
-- most, and (work_items_take_slot) never a slot past the scope's limit. It holds
-- exactly the rows with a scope slot, which are the Running rows of scopes (a row has
-- a slot only while Running, work_items_slots_only_running; a Running scoped row always
-- has one, work_items_take_slot): the index of busy scopes. Every question about a
-- scope's Running items asks for `scope_slot IS NOT NULL`, which no other index's
-- predicate follows from, so this index is the only one that can answer it, whatever
-- the statistics say. (Taken while the queue is idle, they see no Running row, and the
-- planner found reading every Running row through an index whose predicate was
-- `status = 'Running'` alone, and filtering by scope, as cheap: with 300 busy scopes a
-- settle touched 574 buffers instead of 19; tests/integration/test_scope_probes.py,
-- docs/benchmarks.md "Issue 32: 50 scopes".) Read by the claim's and the settle's "is
-- this scope full?" (work_claim_v1, work_settle_locked: is there a row at the position
-- of its limit), by work_scope_full (the enqueue's triggers) and by work_free_slot (the
-- slot a start takes).
CREATE UNIQUE INDEX work_items_one_running_per_scope_slot
    ON work_items (scope, scope_slot) WHERE scope_slot IS NOT NULL;

-- The same for kinds, over the rows with a kind slot (a limited kind's Running items):
-- work_free_slot and work_kind_room read a kind's slots here.
CREATE UNIQUE INDEX work_items_one_running_per_kind_slot
    ON work_items (kind, kind_slot) WHERE kind_slot IS NOT NULL;

-- A kind's Running items without a kind slot (started before the kind had a running
-- limit): work_kind_room and work_free_slot count them against the limit. With the kind
-- slots' index it holds what one index over every Running row would, so an item writes
-- no more index entries than that. Lease recovery (work_recover_v1, work_held_leases_v1)
-- reads the Running rows from the two (`kind_slot IS NOT NULL OR kind_slot IS NULL`,
-- which each of its arms matches to one index: a BitmapOr); they are few (at most the
-- Workers' concurrency, summed), and an index keyed by the lease would be written by
-- every claim and every heartbeat (no heartbeat could be a HOT update).
CREATE INDEX work_items_running_unslotted_kind
    ON work_items (kind) WHERE status = 'Running' AND kind_slot IS NULL;

-- At most one Queued item per dedup key: the enqueue's ON CONFLICT (queries.sql).
CREATE UNIQUE INDEX work_items_one_queued_per_dedup_key
    ON work_items (dedup_key) WHERE status = 'Queued' AND dedup_key IS NOT NULL;

-- What a claim reads, by kind and priority (work_claim_v1, work_seconds_until_due_v1):
-- scope heads, and unscoped items. A busy scope has no entry in either (its heads were
-- taken down when it was claimed).
CREATE INDEX work_items_heads
    ON work_items (kind, priority, run_after, id) WHERE status = 'Queued' AND is_head;
CREATE INDEX work_items_unscoped
    ON work_items (kind, priority, run_after, id) WHERE status = 'Queued' AND scope IS NULL;

-- A scope's heads (a claim of a list of scopes; settling a scope). Its predicate names
-- the scope, so only a query that gives one can use it: a claim over every scope reads
-- work_items_heads in order, never all heads by this one.
CREATE INDEX work_items_heads_by_scope
    ON work_items (scope) WHERE status = 'Queued' AND is_head AND scope IS NOT NULL;

-- Every scope's lines, in order: work_settle_locked finds each line's first item.
CREATE INDEX work_items_lines
    ON work_items (scope, kind, priority, run_after, id)
    WHERE status = 'Queued' AND scope IS NOT NULL;

-- Retention (work_delete_finished_v1): finished items, oldest first.
CREATE INDEX work_items_finished
    ON work_items (finished_at) WHERE status IN ('Succeeded', 'Failed', 'Cancelled');

-- work_settle_noted_v1 deletes a scope's notes together.
CREATE INDEX work_unsettled_scopes_scope ON work_unsettled_scopes (scope);

-- One pause per kind and per scope (work_pause_v1's ON CONFLICT; a claim's probe).
CREATE UNIQUE INDEX work_pauses_kind ON work_pauses (kind) WHERE kind IS NOT NULL;
CREATE UNIQUE INDEX work_pauses_scope ON work_pauses (scope) WHERE scope IS NOT NULL;

-- A Worker's due schedules (queries.sql: due_schedules, next_schedule_due).
CREATE INDEX work_schedules_next_due ON work_schedules (next_due);

-- One limit per kind, per scope, and one default (work_set_limit_v1's ON CONFLICT; the
-- claim's and the slot trigger's look-ups by kind or scope).
CREATE UNIQUE INDEX work_limits_kind ON work_limits (kind) WHERE kind IS NOT NULL;
CREATE UNIQUE INDEX work_limits_scope ON work_limits (scope) WHERE scope IS NOT NULL;
CREATE UNIQUE INDEX work_limits_default ON work_limits ((true))
    WHERE kind IS NULL AND scope IS NULL;

-- A rate limit's oldest starts (work_rate_room, work_take_rate_slot).
CREATE INDEX work_rate_slots_oldest ON work_rate_slots (limit_id, started_at);

-- =====================================================================================
-- 3. Plumbing: channels, pinning, the transitions' marker, the queue's locks
-- =====================================================================================
--
-- The queue may live in a schema of its own (`migrate --schema NAME`, docs/design/
-- schema.md): migrate runs with search_path = NAME, so the objects land there. PL/pgSQL
-- resolves a name with the search_path of the moment it runs, the caller's, so every
-- function of the queue is pinned to its schema (work_pin_search_path), except in
-- public: there every default search_path finds the queue already, and a pinned
-- function pays a save and restore of the setting on every call (1.12x a claim, 1.31x a
-- scoped insert, measured inside PostgreSQL). NOTIFY channels are per schema
-- (work_channel): the functions call pg_notify('trioworker', ...) unqualified, and the
-- pinned path finds the schema's pg_notify below before pg_catalog's.
--
-- Each transition runs as the schema's owner (work_secure_transitions: SECURITY
-- DEFINER, pinned with pg_temp last, in public too, so a temporary table of the
-- caller's cannot stand in for the queue's; and not PUBLIC's to execute), so the right
-- to make a transition is EXECUTE on its function. So do the two triggers deferred to
-- the commit, which run as the session's role once the transition that fired them has
-- returned. Every other function runs as its caller: a helper a transition calls runs
-- as the owner already, and so does a trigger its statements fire; called directly, one
-- can do no more than its caller may. In public the pin is `public, pg_temp`
-- (pg_catalog first, implicitly): `public, pg_catalog, pg_temp` made a scoped enqueue
-- cost 0.90 ms instead of 0.53, each call of work_scope_full planned again under the
-- other path. CREATE OR REPLACE resets both settings, and a new version starts without
-- them, so post-apply.pin-functions.sql and post-apply.secure-transitions.sql run both
-- after every `migrate` that applied anything.

-- The name of a NOTIFY channel in the queue's schema (the Workers LISTEN on these).
-- Channels take 63 bytes: a schema name too long for that (never one --schema takes) is
-- replaced by its md5.
CREATE FUNCTION work_channel(p_name text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN current_schema() = 'public' THEN p_name
                WHEN octet_length(p_name || '.' || current_schema()) <= 63
                THEN p_name || '.' || current_schema()
                ELSE p_name || '.' || md5(current_schema()) END
$$;

-- pg_catalog.pg_notify on the schema's channel: what the queue's functions call.
CREATE FUNCTION pg_notify(p_channel text, p_payload text) RETURNS void
LANGUAGE sql VOLATILE AS $$ SELECT pg_catalog.pg_notify(work_channel(p_channel), p_payload) $$;

-- Pin every function of the queue (named work_..., and pg_notify above) in the
-- current schema to it, but for IMMUTABLE ones: those may read no table, so they need
-- no search_path of their own, and a pinned function is never inlined (work_not_blank,
-- in work_items' CHECK constraint, would cost a function call per row and column).
-- Those already pinned are left alone. Returns how many changed.
CREATE FUNCTION work_pin_search_path() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    home text := current_schema();
    wanted text := format('search_path=%I, pg_catalog, pg_temp', current_schema());
    f regprocedure;
    pinned integer := 0;
BEGIN
    IF home = 'public' THEN  -- found through every default search_path: see above
        RETURN 0;
    END IF;
    FOR f IN
        SELECT p.oid FROM pg_catalog.pg_proc AS p
        JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
        WHERE n.nspname = home AND p.prokind IN ('f', 'p') AND p.provolatile <> 'i'
          AND (p.proname LIKE 'work\_%' OR p.proname = 'pg_notify')
          AND NOT wanted = ANY (COALESCE(p.proconfig, '{}'))
        ORDER BY p.oid
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_catalog, pg_temp', f, home);
        pinned := pinned + 1;
    END LOOP;
    RETURN pinned;
END
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
                            '|declare_limit|delete_finished)_v[0-9]+$')
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

-- The queue's own transitions set trioworker.internal for the length of a call, so the
-- triggers leave the rows they change alone. work_internal_begin sets it and returns what
-- was there; work_internal_end puts that back (calls nest: a transition may call another).
CREATE FUNCTION work_internal_begin() RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    was text := COALESCE(current_setting('trioworker.internal', true), '');
BEGIN
    PERFORM set_config('trioworker.internal', 'on', true);
    RETURN was;
END
$$;

CREATE FUNCTION work_internal_end(p_was text) RETURNS void
LANGUAGE sql AS $$ SELECT set_config('trioworker.internal', p_was, true) $$;

-- The stripe of a scope's locks: 0 .. 16383.
CREATE FUNCTION work_stripe(p_scope text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN hashtext(p_scope) & 16383;

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

-- The settle lock of a scope (the row of its stripe in work_settle_locks): at once if
-- free, else after a bounded wait (an enqueue holds it shared only while it commits;
-- another settle of its stripe, until it commits), or with `p_wait` false not at all.
-- False: it stayed taken, and the caller leaves the scope in work_unsettled_scopes for
-- a later settle.
CREATE FUNCTION work_lock_scope(p_scope text, p_wait boolean DEFAULT true) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    was text := current_setting('lock_timeout');
BEGIN
    PERFORM 1 FROM work_settle_locks WHERE stripe = work_stripe(p_scope)
    FOR UPDATE SKIP LOCKED;
    IF FOUND OR NOT p_wait THEN
        RETURN FOUND;
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

-- =====================================================================================
-- 4. Heads: settling a scope's lines
-- =====================================================================================

-- Put heads where they belong in each of `p_scopes`, whose settle locks the caller
-- holds: none in a busy or paused scope, else the first item of each line. A scope is
-- busy when it has as many Running items as its limit allows (a row at the position of
-- its limit in work_items_one_running_per_scope_slot). One statement over all the
-- scopes reads the firsts (a skip scan over each scope's lines), promotes those not
-- heads yet, steps every other head of those scopes down and announces the scopes with
-- a due head: a completion batch ends items in many scopes, and each statement costs
-- its executor start-up and the table's CHECK constraints, prepared again for every
-- statement that writes a row. A first another transaction holds is passed over and
-- its line's next unheld item stands in (a statement of its own, run only then); its
-- scope is returned in `unsettled`, for a later settle. Returns how many items became
-- heads.
CREATE FUNCTION work_settle_locked(
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
    free AS (
        SELECT f.scope FROM unnest(p_scopes) AS f (scope)
        WHERE NOT EXISTS (  -- its limit's worth Running already: full
                  SELECT FROM work_items AS r
                  WHERE r.scope = f.scope AND r.scope_slot IS NOT NULL
                  OFFSET COALESCE((SELECT l.running FROM work_limits AS l
                                   WHERE l.scope = f.scope), default_running) - 1)
          AND NOT EXISTS (SELECT FROM work_pauses AS p WHERE p.scope = f.scope)
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

-- work_settle_locked for one scope: whether it was settled in full.
CREATE FUNCTION work_settle_scope(p_scope text, OUT promoted integer, OUT settled boolean)
LANGUAGE sql AS $$
    SELECT s.promoted, cardinality(s.unsettled) = 0 FROM work_settle_locked(ARRAY[p_scope]) AS s
$$;

-- Settle each of `p_scopes` (taking their settle locks in a fixed order: by stripe,
-- waiting a bounded time for each unless `p_wait` is false); a scope whose lock stays
-- taken, or that could not be settled in full, is noted for a later settle.
CREATE FUNCTION work_settle_scopes(p_scopes text[], p_wait boolean DEFAULT true)
RETURNS integer
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
        IF work_lock_scope(s, p_wait) THEN
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

-- =====================================================================================
-- 5. Limits: slots and rate slots
-- =====================================================================================

-- A scope's running limit: its own, else the default for scopes, else 1. (PL/pgSQL:
-- a SQL function here was planned again at every call, from every trigger.)
CREATE FUNCTION work_scope_running_limit(p_scope text) RETURNS integer
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN COALESCE((SELECT l.running FROM work_limits AS l WHERE l.scope = p_scope),
                    (SELECT l.running FROM work_limits AS l
                     WHERE l.kind IS NULL AND l.scope IS NULL),
                    1);
END
$$;

-- Whether `p_scope` has as many Running items as its limit allows (not counting item
-- `p_except`, one being changed by hand: the enqueue's triggers ask); the limit read
-- once, the scope's slots read from its own index.
CREATE FUNCTION work_scope_full(p_scope text, p_except bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    allowed integer := work_scope_running_limit(p_scope);
    held integer;
BEGIN
    SELECT count(*) INTO held FROM (
        SELECT r.scope_slot FROM work_items AS r
        WHERE r.scope = p_scope AND r.scope_slot IS NOT NULL
        LIMIT allowed + 1) AS running;
    IF held >= allowed AND p_except IS NOT NULL
       AND EXISTS (SELECT FROM work_items AS e
                   WHERE e.id = p_except AND e.scope = p_scope AND e.scope_slot IS NOT NULL) THEN
        held := held - 1;
    END IF;
    RETURN held >= allowed;
END
$$;

-- How many more items of `p_kind` may start now by its running limit (NULL: it has
-- none): its Running rows with a kind slot and without, each through its own index.
CREATE FUNCTION work_kind_room(p_kind text) RETURNS integer
LANGUAGE sql STABLE
RETURN (SELECT GREATEST(l.running
                        - (SELECT count(*) FROM work_items AS r
                           WHERE r.kind = p_kind AND r.kind_slot IS NOT NULL)
                        - (SELECT count(*) FROM work_items AS r
                           WHERE r.kind = p_kind AND r.status = 'Running'
                             AND r.kind_slot IS NULL), 0)
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
-- open rate slot it found, as work_rate_room does. (The claim no longer calls it: it
-- asks the same in its own statement, work_rate_room only for a scope with a rate.)
CREATE FUNCTION work_scope_rate_open(p_scope text) RETURNS boolean
LANGUAGE sql VOLATILE
RETURN COALESCE((SELECT work_rate_room(l.id, l.per, 1) > 0 FROM work_limits AS l
                 WHERE l.scope = p_scope AND l.rate IS NOT NULL), true);

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
-- many other Running items it has (a kind's without a slot included). Not counting
-- item `p_except`, the row being started.
CREATE FUNCTION work_free_slot(
    p_scope text, p_kind text, p_limit integer, p_except bigint,
    OUT slot integer, OUT held integer
)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    taken integer[];
    unslotted integer := 0;
    own integer;
BEGIN
    IF p_kind IS NULL THEN
        SELECT COALESCE(array_agg(r.scope_slot), '{}') INTO taken FROM work_items AS r
        WHERE r.scope = p_scope AND r.scope_slot IS NOT NULL;
        SELECT e.scope_slot INTO own FROM work_items AS e
        WHERE e.id = p_except AND e.scope = p_scope AND e.scope_slot IS NOT NULL;
    ELSE
        SELECT COALESCE(array_agg(r.kind_slot), '{}') INTO taken FROM work_items AS r
        WHERE r.kind = p_kind AND r.kind_slot IS NOT NULL;
        SELECT count(*) INTO unslotted FROM work_items AS r
        WHERE r.kind = p_kind AND r.status = 'Running' AND r.kind_slot IS NULL
          AND r.id IS DISTINCT FROM p_except;
        SELECT e.kind_slot INTO own FROM work_items AS e
        WHERE e.id = p_except AND e.kind = p_kind AND e.kind_slot IS NOT NULL;
    END IF;
    IF FOUND AND own IS NOT NULL THEN
        taken := taken[:array_position(taken, own) - 1]
                 || taken[array_position(taken, own) + 1:];
    END IF;
    held := cardinality(taken) + unslotted;
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

-- Whether a kind has a limit (running or rate) a start must take a slot of.
CREATE FUNCTION work_kind_limited(p_kind text) RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM work_limits WHERE kind = p_kind);
END
$$;

-- =====================================================================================
-- 6. Triggers: what every writer's statements set off
-- =====================================================================================

-- An item arrives in a line (inserted, or changed by hand into Queued or into another
-- line or place): it becomes a head unless something certainly goes before it. At
-- READ COMMITTED that is read from the table, confirmed at commit below; at
-- REPEATABLE READ or SERIALIZABLE the snapshot may be older than the commit, and
-- reading would make serializable enqueues conflict, so only a head this transaction
-- itself placed earlier in the same line counts (kept in trioworker.last_head).
CREATE FUNCTION work_items_arrive() RETURNS trigger
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

CREATE TRIGGER work_items_arrive
    BEFORE INSERT OR UPDATE OF status, scope, kind, priority, run_after ON work_items
    FOR EACH ROW
    WHEN ((NEW.scope IS NOT NULL OR NEW.is_head)
          AND current_setting('trioworker.internal', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION work_items_arrive();

-- At commit, an item placed behind (at READ COMMITTED) checks that something still
-- goes before it, holding its scope's settle lock shared (try only: FOR SHARE SKIP
-- LOCKED on the row of its stripe) so that no settle of the scope can start until this
-- transaction has committed (a settle that starts later sees this item). If the lock is
-- taken, or nothing goes before it any more, the item makes itself a head: an extra
-- head is harmless. This trigger runs as the role whose transaction enqueued (SECURITY
-- DEFINER, work_secure_transitions: FOR SHARE asks for UPDATE on work_settle_locks).
CREATE FUNCTION work_items_confirm_place() RETURNS trigger
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

CREATE CONSTRAINT TRIGGER work_items_confirm_place
    AFTER INSERT OR UPDATE OF status, scope, kind, priority, run_after ON work_items
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.status = 'Queued' AND NEW.scope IS NOT NULL AND NOT NEW.is_head
          AND current_setting('trioworker.internal', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION work_items_confirm_place();

-- A head or a Running item changed or deleted by hand: its scope must be settled
-- again. Noted (an insert, no lock) and announced; a Worker settles it.
CREATE FUNCTION work_items_depart() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO work_unsettled_scopes (scope) VALUES (OLD.scope);
    PERFORM pg_notify('trioworker_settle', OLD.scope);
    RETURN NULL;
END
$$;

CREATE TRIGGER work_items_depart_update
    AFTER UPDATE OF status, scope, kind, priority, run_after ON work_items
    FOR EACH ROW
    WHEN ((OLD.status = 'Running' OR OLD.is_head) AND OLD.scope IS NOT NULL
          AND (OLD.status, OLD.scope, OLD.kind, OLD.priority, OLD.run_after)
              IS DISTINCT FROM (NEW.status, NEW.scope, NEW.kind, NEW.priority, NEW.run_after)
          AND current_setting('trioworker.internal', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION work_items_depart();

CREATE TRIGGER work_items_depart_delete
    AFTER DELETE ON work_items
    FOR EACH ROW
    WHEN ((OLD.status = 'Running' OR OLD.is_head) AND OLD.scope IS NOT NULL
          AND current_setting('trioworker.internal', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION work_items_depart();

-- Wake idle Workers for unscoped items that arrive due (scoped heads notify above).
CREATE FUNCTION work_items_notify_unscoped() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted
               WHERE scope IS NULL AND status = 'Queued' AND run_after <= now()) THEN
        PERFORM pg_notify('trioworker', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER work_items_notify_unscoped
    AFTER INSERT ON work_items
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION work_items_notify_unscoped();

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

-- Fired only where a slot exists or may be taken: a row holding a slot, or one becoming
-- or staying Running that is scoped or of a kind with a limit. An unscoped row holding
-- no slot, of a kind without a limit, is passed over (the function would set both
-- slots NULL, as they are): most claims of unscoped work call nothing.
CREATE TRIGGER work_items_take_slot
    BEFORE INSERT OR UPDATE OF status, scope, kind, scope_slot, kind_slot ON work_items
    FOR EACH ROW
    WHEN (NEW.scope_slot IS NOT NULL OR NEW.kind_slot IS NOT NULL
          OR (NEW.status = 'Running'
              AND (NEW.scope IS NOT NULL OR work_kind_limited(NEW.kind))))
    EXECUTE FUNCTION work_items_take_slot();

-- A trigger that refuses the row, as a CHECK would, for a bound that should not be held
-- on every UPDATE: PostgreSQL prepares each CHECK of a table again for every statement
-- that writes one of its rows (about 5 µs for one of these, whatever it checks), while a
-- trigger `UPDATE OF` some columns is passed over by a statement that sets none of them,
-- and its WHEN is prepared only by one that does. The WHEN is the bound; the function is
-- called only to refuse. TG_ARGV[0]: the bound's name (the trigger's own); TG_ARGV[1]:
-- what it says; the rest: the columns whose values the error shows.
CREATE FUNCTION work_refuse_row() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    stored jsonb := to_jsonb(NEW);
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'check_violation', CONSTRAINT = TG_ARGV[0],
        SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
        MESSAGE = format('new row for relation "%s" violates %s: %s',
                         TG_TABLE_NAME, TG_ARGV[0], TG_ARGV[1]),
        DETAIL = format('Failing row has %s.',
                        (SELECT string_agg(format('%s = %s', c, COALESCE(stored ->> c, 'NULL')),
                                           ', ')
                         FROM unnest(TG_ARGV[2:]) AS c));
END
$$;

-- What an enqueue asks for (the times an enqueue writes and a retry moves; the names,
-- the priority, the payload and the trace context), which the claim, the heartbeats and
-- the finish never write, so never test: bounds that were CHECKs would be tested again
-- on every UPDATE of a row. One trigger, `UPDATE OF` those columns, holds them all (two
-- triggers on an insert cost more than one: a one-row insert 156 us with one, 174 us
-- with two). Its function refuses the row by the first bound it breaks (the times
-- first, then the others by name), with the bound's name as the constraint and SQLSTATE
-- 23514, as a CHECK's, as work_refuse_row does. Called only when the trigger's WHEN
-- found a bound broken.
--
-- The bounds: a kind, scope or dedup key is 1 to 200 characters, not only white space (as
-- every Python path refuses it); a priority from -1000 to 1000. A payload is at most
-- 131072 bytes as JSON text, a safety net for every writer: the library refuses payloads
-- over 64 KiB of compact JSON; jsonb's own text adds a space after each ':' and ',', so
-- the database allows twice that (a 10 MB payload from SQL is still refused). No payload
-- value nests 64 levels deep (trioworker._core.jsontext.MAX_DEPTH; every Python enqueue
-- path checks the same bound first and names it): Python's json cannot read back nesting
-- much past its recursion limit, so a deeper payload, valid jsonb and inside the size
-- limit, would be a poison pill for every Worker that claims it. The jsonpath stops at
-- the level it looks for: a deep payload costs no more to check.
CREATE FUNCTION work_items_refuse_asked() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    broken text;
    says text;
    shown text[];
    stored jsonb := to_jsonb(NEW);
BEGIN
    SELECT b.name, b.says, b.shown INTO broken, says, shown
    FROM (VALUES
        (1, 'work_items_asked_times_in_range',
         'requested_at and run_after are finite times from 1900 to 9000 (UTC)',
         ARRAY['id', 'requested_at', 'run_after'],
         LEAST(NEW.requested_at, NEW.run_after) >= '1900-01-01 00:00:00+00'
         AND GREATEST(NEW.requested_at, NEW.run_after) <= '9000-01-01 00:00:00+00'),
        (2, 'work_items_dedup_key_sane', 'a dedup key is 1 to 200 characters',
         ARRAY['id', 'dedup_key'],
         NEW.dedup_key <> '' AND length(NEW.dedup_key) <= 200),
        (3, 'work_items_kind_sane', 'a kind is 1 to 200 characters',
         ARRAY['id', 'kind'],
         NEW.kind <> '' AND length(NEW.kind) <= 200),
        (4, 'work_items_names_not_blank',
         'a kind, scope or dedup key is not only white space',
         ARRAY['id', 'kind', 'scope', 'dedup_key'],
         work_not_blank(NEW.kind) AND (NEW.scope IS NULL OR work_not_blank(NEW.scope))
         AND (NEW.dedup_key IS NULL OR work_not_blank(NEW.dedup_key))),
        (5, 'work_items_payload_depth', 'a payload nests at most 64 levels deep',
         ARRAY['id', 'kind'],
         NOT jsonb_path_exists(NEW.payload, 'strict $.**{64}')),
        (6, 'work_items_payload_fits', 'a payload is at most 131072 bytes as JSON text',
         ARRAY['id', 'kind'],
         octet_length(NEW.payload::text) <= 131072),
        (7, 'work_items_priority_sane', 'a priority is from -1000 to 1000',
         ARRAY['id', 'priority'],
         NEW.priority >= -1000 AND NEW.priority <= 1000),
        (8, 'work_items_scope_sane', 'a scope is 1 to 200 characters',
         ARRAY['id', 'scope'],
         NEW.scope <> '' AND length(NEW.scope) <= 200),
        (9, 'work_items_trace_context_sane',
         'a trace context is a JSON object of strings, at most 8192 bytes as JSON text',
         ARRAY['id', 'kind'],
         jsonb_typeof(NEW.trace_context) = 'object'
         AND NOT jsonb_path_exists(NEW.trace_context, '$.*?(@.type() != "string")')
         AND octet_length(NEW.trace_context::text) <= 8192)
    ) AS b (n, name, says, shown, holds)
    WHERE b.holds IS FALSE
    ORDER BY b.n LIMIT 1;
    IF broken IS NULL THEN
        RETURN NEW;  -- (the WHEN and this list disagree: never, the test says)
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'check_violation', CONSTRAINT = broken,
        SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
        MESSAGE = format('new row for relation "%s" violates %s: %s',
                         TG_TABLE_NAME, broken, says),
        DETAIL = format('Failing row has %s.',
                        (SELECT string_agg(format('%s = %s', c, COALESCE(stored ->> c, 'NULL')),
                                           ', ')
                         FROM unnest(shown) AS c));
END
$$;

-- The WHEN is the bounds, each broken only when false (a CHECK passes NULL), written out
-- (a function would be inlined and prepared again for every statement anyway).
CREATE TRIGGER work_items_asked_in_bounds
    BEFORE INSERT OR UPDATE OF requested_at, run_after, kind, scope, dedup_key, priority,
                               payload, trace_context ON work_items
    FOR EACH ROW
    WHEN (LEAST(NEW.requested_at, NEW.run_after) < '1900-01-01 00:00:00+00'
          OR GREATEST(NEW.requested_at, NEW.run_after) > '9000-01-01 00:00:00+00'
          OR (NEW.dedup_key <> '' AND length(NEW.dedup_key) <= 200) IS FALSE
          OR (NEW.kind <> '' AND length(NEW.kind) <= 200) IS FALSE
          OR (work_not_blank(NEW.kind) AND (NEW.scope IS NULL OR work_not_blank(NEW.scope))
              AND (NEW.dedup_key IS NULL OR work_not_blank(NEW.dedup_key))) IS FALSE
          OR jsonb_path_exists(NEW.payload, 'strict $.**{64}') IS TRUE
          OR (octet_length(NEW.payload::text) <= 131072) IS FALSE
          OR (NEW.priority >= -1000 AND NEW.priority <= 1000) IS FALSE
          OR (NEW.scope <> '' AND length(NEW.scope) <= 200) IS FALSE
          OR (jsonb_typeof(NEW.trace_context) = 'object'
              AND NOT jsonb_path_exists(NEW.trace_context, '$.*?(@.type() != "string")')
              AND octet_length(NEW.trace_context::text) <= 8192) IS FALSE)
    EXECUTE FUNCTION work_items_refuse_asked();

-- The times an attempt writes: the claim, each heartbeat, the finish, a completion in
-- the handler's own transaction.
CREATE TRIGGER work_items_attempt_times_in_range
    BEFORE INSERT OR UPDATE OF lease_expires_at, heartbeat_at, started_at, finished_at,
                               completed_at ON work_items
    FOR EACH ROW WHEN (LEAST(NEW.lease_expires_at, NEW.heartbeat_at, NEW.started_at,
                             NEW.finished_at, NEW.completed_at) < '1900-01-01 00:00:00+00'
                       OR GREATEST(NEW.lease_expires_at, NEW.heartbeat_at, NEW.started_at,
                                   NEW.finished_at, NEW.completed_at)
                          > '9000-01-01 00:00:00+00')
    EXECUTE FUNCTION work_refuse_row(
        'work_items_attempt_times_in_range',
        'lease_expires_at, heartbeat_at, started_at, finished_at and completed_at are'
        ' finite times from 1900 to 9000 (UTC)',
        'id', 'lease_expires_at', 'heartbeat_at', 'started_at', 'finished_at', 'completed_at');

-- The counters. A CHECK of `x <= bound` would not do: every transition adds one, and a
-- row at the bound would refuse the claim that takes it (or the recovery that stalls
-- it) as surely as an overflow, with every other item of that statement. What holds
-- instead: a counter is *set* (an INSERT, or an UPDATE to a new value) to at most
-- 1,000,000,000, and moves past that only one at a time, as the queue's own transitions
-- move it. From the bound to 2147483647 is 1,147,483,647 more claims, stalls or failures
-- of one item: no honest item comes near the bound (a retry a second for 31 years), and
-- nothing brings one to the overflow. The WHEN passes every row below the bound, so the
-- function is called only past it. Below zero is work_items_counters_sane's.
CREATE FUNCTION work_items_counters_bounded() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND (NEW.attempt <= 1000000000 OR NEW.attempt - OLD.attempt IN (0, 1))
       AND (NEW.stalls <= 1000000000 OR NEW.stalls - OLD.stalls IN (0, 1))
       AND (NEW.failures <= 1000000000 OR NEW.failures - OLD.failures IN (0, 1)) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'check_violation',
        CONSTRAINT = 'work_items_counters_bounded',
        SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
        MESSAGE = 'new row for relation "work_items" violates work_items_counters_bounded:'
                  ' attempt, stalls and failures are set to at most 1000000000, and grow'
                  ' past it by one at a time',
        DETAIL = format('Failing row has id = %s, attempt = %s, stalls = %s, failures = %s.',
                        NEW.id, NEW.attempt, NEW.stalls, NEW.failures);
END
$$;

CREATE TRIGGER work_items_counters_bounded
    BEFORE INSERT OR UPDATE OF attempt, stalls, failures ON work_items
    FOR EACH ROW WHEN (GREATEST(NEW.attempt, NEW.stalls, NEW.failures) > 1000000000)
    EXECUTE FUNCTION work_items_counters_bounded();

-- A pause added, lifted or changed by hand: settle its scope.
CREATE FUNCTION work_pauses_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s text;
BEGIN
    FOREACH s IN ARRAY ARRAY[CASE WHEN TG_OP <> 'INSERT' THEN OLD.scope END,
                             CASE WHEN TG_OP <> 'DELETE' THEN NEW.scope END] LOOP
        IF s IS NOT NULL THEN
            INSERT INTO work_unsettled_scopes (scope) VALUES (s);
            PERFORM pg_notify('trioworker_settle', s);
        END IF;
    END LOOP;
    PERFORM pg_notify('trioworker', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER work_pauses_changed
    AFTER INSERT OR UPDATE OR DELETE ON work_pauses
    FOR EACH ROW
    WHEN (current_setting('trioworker.internal', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION work_pauses_changed();

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
-- again, since a raised limit gives a busy scope heads. At commit, once every claim in
-- flight that may have read the old limit has ended: each holds the claim lock of
-- every scope it takes until it commits, and this takes those locks (the changed
-- scope's, or every stripe for the default) in stripe order, waiting for them. So a
-- claim that read the old limit has committed before the scopes to settle are read,
-- and a claim after it passes over those scopes (try only) until this commits, then
-- reads the new limit. Settles need nothing here: each reads the limits under its
-- scope's settle lock, which the settle of every scope noted below waits for. Like
-- confirm_place, it runs at the commit of whoever changed the limit (SECURITY DEFINER).
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

CREATE CONSTRAINT TRIGGER work_limits_settle
    AFTER INSERT OR UPDATE OR DELETE ON work_limits
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    EXECUTE FUNCTION work_limits_settle();

-- =====================================================================================
-- 7. The transitions. Every public one is work_NAME_v1; each is the only place its
--    write is made (queries.sql calls them, as does plain SQL).
-- =====================================================================================

-- -- claim -------------------------------------------------------------------------------

-- The failover guard (docs/design/failover.md, ADR 0012). With asynchronous
-- replication, a claim the old primary acknowledged can be missing on the promoted
-- standby: there its scope looks free, and a second attempt could start while the first
-- still runs its handler. So the database notes the timeline claims run on; the first
-- claim on a new timeline (a promotion, a switchover, a point-in-time restore) holds
-- claims of scoped work for one lease, the longest any claim has taken: every attempt
-- that may have run on the old timeline has stopped by then (it self-stops half a lease
-- after its last heartbeat there, and Settings keep half the lease + the stop grace
-- under one lease). Unscoped work goes on. The `claim` statement (queries.sql) asks
-- work_failover_hold_v1 first: while it answers true, the claim is given no scopes.

-- The timeline this server writes WAL on now (the first 8 hex digits of the current
-- WAL file's name). A standby has none: it answers as a read-only server does.
CREATE FUNCTION work_timeline() RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'cannot claim on a standby (it is in recovery)'
            USING ERRCODE = 'read_only_sql_transaction';
    END IF;
    RETURN ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
END
$$;

INSERT INTO work_failover_guard (timeline) VALUES (work_timeline());

-- Whether claims of scoped work must wait now. Notes the claimer's lease (a write only
-- when it is the longest yet) and, on a timeline it has not seen, starts the hold:
-- one lease (the longest seen, or this claimer's) from now, which is after the
-- promotion, so after every old attempt's last heartbeat on the old timeline.
CREATE FUNCTION work_failover_hold_v1(p_lease double precision) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET jit = off
AS $$
DECLARE
    current_timeline bigint := work_timeline();
    guard work_failover_guard;
BEGIN
    SELECT * INTO guard FROM work_failover_guard;
    IF NOT FOUND THEN
        -- Deleted by hand: what ran before is unknown, so hold as after a failover.
        INSERT INTO work_failover_guard (timeline, lease, held_until)
        VALUES (current_timeline, p_lease, now() + make_interval(secs => p_lease))
        ON CONFLICT (singleton) DO NOTHING;
        RETURN true;
    END IF;
    IF guard.timeline <> current_timeline THEN
        -- Under READ COMMITTED a claimer that waited on this row re-checks the WHERE,
        -- finds the timeline noted, and leaves the first one's hold as it is.
        UPDATE work_failover_guard
        SET timeline = current_timeline,
            lease = GREATEST(lease, p_lease),
            held_until = now() + make_interval(secs => GREATEST(lease, p_lease))
        WHERE timeline <> current_timeline;
        SELECT * INTO guard FROM work_failover_guard;
    ELSIF p_lease > guard.lease THEN
        UPDATE work_failover_guard SET lease = p_lease WHERE lease < p_lease;
    END IF;
    RETURN guard.held_until > now();
END
$$;

-- Claim up to `p_limit` due items of `p_kinds` for `p_worker` (docs/design/claim.md):
--
-- * the candidates: heads of free scopes and unscoped items of the served kinds that
--   are not paused, from every scope (p_scopes NULL) or only the listed ones, best
--   first (priority DESC, run_after, id) and at most one per scope. Each (kind,
--   priority) level is read in run_after order from the heads and unscoped indexes,
--   the levels found by a skip scan, so neither a busy scope's backlog nor other
--   kinds' work is ever walked; rows a concurrent claim holds are skipped as the
--   levels are read (FOR UPDATE SKIP LOCKED), so concurrent claims take different
--   items rather than the same ones;
-- * claims of one scope take turns on its claim lock (the row of its stripe in
--   work_claim_locks, try only: a scope another claim is taking is passed over);
-- * a scope is passed over when it is full (as many Running as its limit: a Running
--   row at the position of its limit, `OFFSET limit - 1`, one probe of the busy scopes'
--   index) or its rate window has no start left (work_rate_room, called only for a
--   scope with a rate); both asked in the claim's own statement, planned with it once a
--   session, not through a function call per head read. A kind at its running limit or
--   out of rate is not read; a batch takes no more of a kind than its limits let start;
-- * the candidates, locked as they were read, become Running. The heads of a claimed
--   scope's other lines stay until the scope is settled when its item ends; claims
--   pass over them with one probe each, so a busy scope costs a claim at most one
--   probe per line, never one per item waiting in it. After a round, each claimed
--   scope whose limit is over one is settled (try only), so its next item is a head
--   while it has room, and the claim goes round again for those heads while the batch
--   is not full (asked only when some limit lets a scope run more than one).
--
-- A candidate whose scope's claim lock is taken does not empty the batch: each round
-- claims what it locked, passes over the refused scopes, and looks further, until the
-- batch is full or a round is refused nothing. The first round reads as many candidates
-- as the batch takes; a further round, needed only after a refusal, reads eight times
-- as many as the one before it, so a claim stays a few rounds long whatever number of
-- scopes is held.
--
-- The schema holds the rule and the limits under races (work_items_take_slot and the
-- slot indexes): a claim that meets a start its snapshot could not see (one set by
-- hand, or a claim that committed a moment before this one took the lock) loses by the
-- index's or the refusal's name, and the store claims again at once.
CREATE FUNCTION work_claim_v1(
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
    promoted integer;  -- items the round's settle made heads
    -- The running limit of scopes without one of their own.
    default_running integer := COALESCE((SELECT l.running FROM work_limits AS l
                                         WHERE l.kind IS NULL AND l.scope IS NULL), 1);
    -- Whether any scope may run more than one (else no claimed scope is roomy).
    any_roomy boolean := EXISTS (SELECT FROM work_limits AS l
                                 WHERE l.kind IS NULL AND l.running > 1);
BEGIN
    -- A round takes at most one item a scope. A claimed scope whose limit lets more
    -- start is settled after it, so the next item of the claimed line is a head (unless
    -- the scope is full), and while the batch is not full and a settle made heads, the
    -- claim goes round again: a claim comes back short only when nothing more was due.
    -- These settles never wait for a settle lock: a transaction that finished items
    -- first (work_finish_and_claim_v1) holds theirs, and a second set taken in another
    -- order could wait on a transaction waiting on it. A scope whose lock is taken is
    -- noted for a later settle.
    LOOP
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
                          AND NOT EXISTS (  -- its limit's worth Running already: full
                              SELECT FROM work_items AS r
                              WHERE r.scope = h.scope AND r.scope_slot IS NOT NULL
                              OFFSET COALESCE((SELECT l.running FROM work_limits AS l
                                               WHERE l.scope = h.scope), default_running) - 1)
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
                          AND NOT EXISTS (  -- its limit's worth Running already: full
                              SELECT FROM work_items AS r
                              WHERE r.scope = h.scope AND r.scope_slot IS NOT NULL
                              OFFSET COALESCE((SELECT l.running FROM work_limits AS l
                                               WHERE l.scope = h.scope), default_running) - 1)
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
                               AND NOT EXISTS (SELECT FROM work_limits AS l  -- rate spent
                                               WHERE l.scope = d.scope AND l.rate IS NOT NULL
                                                 AND work_rate_room(l.id, l.per, 1) = 0))
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
                    IF any_roomy AND (got.item).scope IS NOT NULL
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
        EXIT WHEN cardinality(roomy) = 0;
        promoted := work_settle_scopes(roomy, false);
        roomy := '{}';
        EXIT WHEN wanted = 0 OR promoted = 0;
        passed := '{}';
        window_size := wanted;
    END LOOP;
    PERFORM work_internal_end(was);
END
$$;

-- Seconds until the next head or unscoped item of `p_kinds` (those not paused) that is
-- not due yet becomes due, or until a rate window that holds due work back has a start
-- again (NULL: none), for an idle Worker's sleep.
CREATE FUNCTION work_seconds_until_due_v1(
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

-- -- while an attempt runs: heartbeat, the fence, a completion in the fence -------------

-- Renew the leases of attempts, each fenced by (id, attempt), in one statement: one row
-- back for each attempt asked about. `lost`: it no longer owns a Running item (as the
-- statement's snapshot saw the rows). With p_wait false (the Worker's heartbeat of every
-- lease it holds), a row another transaction holds (its attempt's fenced transaction, an
-- operator's) is passed over, never waited for: it comes back neither renewed
-- (cancel_requested NULL) nor lost. With p_wait true, such a row is waited for. An
-- attempt that committed its success in its own transaction (completed_at) still renews
-- its lease while its handler runs on; a cancel asked of it is moot (its success is
-- durable), so it is not reported. PL/pgSQL, so its plans are kept for the session as
-- the statement's own were when the client sent it (a SQL function's body is planned
-- at every call on PostgreSQL 15); no SET clause, which would cost every call.
CREATE FUNCTION work_heartbeat_v1(
    p_ids bigint[], p_attempts integer[], p_lease double precision,
    p_wait boolean DEFAULT false
) RETURNS TABLE (id bigint, attempt integer, cancel_requested boolean, lost boolean)
LANGUAGE plpgsql AS $$
BEGIN
    IF p_wait THEN
        RETURN QUERY
        WITH asked AS (
            SELECT a.id, a.attempt FROM unnest(p_ids, p_attempts) AS a (id, attempt)
        ), renewed AS (
            UPDATE work_items AS w
            SET lease_expires_at = now() + make_interval(secs => p_lease), heartbeat_at = now()
            FROM asked AS a
            WHERE w.id = a.id AND w.attempt = a.attempt AND w.status = 'Running'
            RETURNING w.id, w.attempt, w.cancel_requested AND w.completed_at IS NULL AS cancel
        )
        SELECT a.id, a.attempt, r.cancel, r.id IS NULL
        FROM asked AS a LEFT JOIN renewed AS r ON r.id = a.id AND r.attempt = a.attempt;
        RETURN;
    END IF;
    RETURN QUERY
    WITH asked AS (
        SELECT a.id, a.attempt FROM unnest(p_ids, p_attempts) AS a (id, attempt)
    ), locked AS (
        SELECT w.id FROM work_items AS w JOIN asked AS a ON w.id = a.id AND w.attempt = a.attempt
        WHERE w.status = 'Running'
        FOR NO KEY UPDATE OF w SKIP LOCKED
    ), renewed AS (
        UPDATE work_items AS w
        SET lease_expires_at = now() + make_interval(secs => p_lease), heartbeat_at = now()
        FROM locked WHERE w.id = locked.id
        RETURNING w.id, w.attempt, w.cancel_requested AND w.completed_at IS NULL AS cancel
    )
    SELECT a.id, a.attempt, r.cancel,
           r.id IS NULL AND NOT EXISTS (
               SELECT FROM work_items AS w
               WHERE w.id = a.id AND w.attempt = a.attempt AND w.status = 'Running'
           )
    FROM asked AS a LEFT JOIN renewed AS r ON r.id = a.id AND r.attempt = a.attempt;
END
$$;

-- The fence: a fenced transaction's first statement (`ctx.transaction()`) locks its
-- attempt's row until the commit, if the attempt still owns a Running item (false: it
-- does not, nothing is locked, and the store writes nothing). While it is held, the
-- item's heartbeat passes it over and lease recovery cannot take it; so nothing the
-- handler writes in that transaction commits once another attempt owns the item. The
-- lock the UPDATEs above take (FOR NO KEY UPDATE), so a foreign key's share lock on the
-- row does not conflict. It runs as its caller: locking a row needs UPDATE of a column
-- of work_items, which docs/grants.sql gives the Worker's role.
CREATE FUNCTION work_fence_v1(p_id bigint, p_attempt integer) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM FROM work_items AS w
    WHERE w.id = p_id AND w.attempt = p_attempt AND w.status = 'Running'
    FOR NO KEY UPDATE;
    RETURN FOUND;
END
$$;

-- A fenced transaction's last statement when the handler called `tx.complete()`: the
-- attempt's success, noted in the handler's own commit (durable), on its row locked by
-- work_fence_v1. The row stays Running, holding its scope's slot and its kind's, until
-- the Worker finishes it (work_finish_v1, Succeeded) once the handler has returned, or
-- lease recovery does. statement_timestamp(), not now(): the transaction began before
-- the handler's own statements. False: the attempt no longer owns the item.
CREATE FUNCTION work_complete_v1(p_id bigint, p_attempt integer) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE work_items AS w SET completed_at = COALESCE(w.completed_at, statement_timestamp())
    WHERE w.id = p_id AND w.attempt = p_attempt AND w.status = 'Running';
    RETURN FOUND;
END
$$;

-- -- an attempt's end: finish, requeue (release, retry) ---------------------------------

-- Note how attempt p_id's current attempt ended (not a success) in work_attempts, and
-- keep the item's last 20 such notes. Call it before the row's attempt fields change.
CREATE FUNCTION work_note_attempt(
    p_id bigint, p_outcome text, p_error text DEFAULT NULL, p_traceback text DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    noted integer;
BEGIN
    INSERT INTO work_attempts (item_id, attempt, worker_id, started_at, outcome, error, traceback)
    SELECT id, attempt, worker_id, started_at, p_outcome, p_error, p_traceback
    FROM work_items WHERE id = p_id
    ON CONFLICT (item_id, attempt) DO NOTHING
    RETURNING attempt INTO noted;
    IF noted > 20 THEN
        DELETE FROM work_attempts WHERE item_id = p_id AND attempt <= noted - 20;
    END IF;
END
$$;

-- End attempts as Succeeded, Failed or Cancelled, fenced by (id, attempt), and settle
-- their scopes. With p_wait false, a row another transaction holds for more than a
-- moment is passed over (the caller writes it on its own), so one held row never delays
-- the rest of a batch. An attempt that committed its success in its own transaction
-- (completed_at set) can only be finished Succeeded: a Failed or Cancelled write of it
-- applies nothing. Returns the ids written. Its rows come by primary key (`id =
-- ANY(ids)`, each attempt compared by a binary search in the ids sorted), and status is
-- compared with a variable, which no partial index's predicate can match: a generic plan
-- with `status = 'Running'` read every Running row from a partial index and tested each
-- against every id ("Rows Removed by Join Filter: 25500" for 100 items with 256
-- Running); this reads its batch and nothing else, however many items are Running.
CREATE FUNCTION work_finish_v1(
    p_ids bigint[], p_attempts integer[], p_status text, p_reason text DEFAULT NULL,
    p_error text DEFAULT NULL, p_wait boolean DEFAULT true, p_traceback text DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
AS $$
DECLARE
    was text := work_internal_begin();
    was_timeout text := current_setting('lock_timeout');
    -- A variable, not a literal: no partial index of Running rows can serve the
    -- statements below, so their rows come by primary key.
    running text := 'Running';
    ids bigint[];
    attempts integer[];
    done_ids bigint[];
    done_scopes text[];
BEGIN
    IF p_status NOT IN ('Succeeded', 'Failed', 'Cancelled') THEN
        RAISE EXCEPTION 'work_finish_v1: % is not a final status', p_status;
    END IF;
    -- The ids in order, each once, with its latest attempt asked for (attempts only
    -- grow, so an earlier one of the same item can no longer own it).
    SELECT array_agg(d.id ORDER BY d.id), array_agg(d.attempt ORDER BY d.id)
    INTO ids, attempts
    FROM (SELECT a.id, max(a.attempt) AS attempt
          FROM unnest(p_ids, p_attempts) AS a (id, attempt)
          WHERE a.id IS NOT NULL GROUP BY a.id) AS d;

    -- One UPDATE, tried at most twice: with p_wait false the first try waits 50 ms at
    -- most for a held row, and the second passes over the rows still held.
    FOR pass IN 1..2 LOOP
        BEGIN
            IF NOT p_wait AND pass = 1 THEN
                PERFORM set_config('lock_timeout', '50ms', true);
            END IF;
            WITH done AS (
                UPDATE work_items AS w
                SET status = p_status, finished_at = now(), lease_expires_at = NULL,
                    reason = CASE WHEN p_status = 'Succeeded' THEN w.reason ELSE p_reason END,
                    error = CASE WHEN p_status = 'Failed' THEN p_error ELSE w.error END,
                    traceback = CASE WHEN p_status = 'Failed' THEN p_traceback
                                     ELSE w.traceback END,
                    failures = w.failures + (p_status = 'Failed')::integer
                -- width_bucket: the row's place in the sorted ids (a binary search).
                WHERE w.id = ANY(ids) AND w.attempt = attempts[width_bucket(w.id, ids)]
                  AND w.status = running
                  AND (p_status = 'Succeeded' OR w.completed_at IS NULL)
                  AND (pass = 1 OR w.id IN (SELECT l.id FROM work_items AS l
                                            WHERE l.id = ANY(ids) AND l.status = running
                                            FOR UPDATE SKIP LOCKED))
                RETURNING w.id, w.scope
            )
            SELECT array_agg(done.id),
                   array_agg(done.scope) FILTER (WHERE done.scope IS NOT NULL)
            INTO done_ids, done_scopes FROM done;
            PERFORM set_config('lock_timeout', was_timeout, true);
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            -- Another transaction holds one of the rows: the next pass writes the rest;
            -- the caller writes that one on its own.
            NULL;
        END;
    END LOOP;
    IF p_status <> 'Succeeded' AND done_ids IS NOT NULL THEN
        -- Its attempt, worker and start are still on the row.
        PERFORM work_note_attempt(d, lower(p_status), p_error, p_traceback)
        FROM unnest(done_ids) AS d;
    END IF;
    IF done_scopes IS NOT NULL THEN
        PERFORM work_settle_scopes(done_scopes);
    END IF;
    PERFORM work_internal_end(was);
    RETURN QUERY SELECT unnest(done_ids);
END
$$;

-- Back to Queued at the item's place in line (after p_delay seconds for a retry).
CREATE FUNCTION work_requeue_update(
    p_id bigint, p_cause text, p_delay double precision, p_error text, p_traceback text
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE work_items
    SET status = 'Queued', is_head = false, worker_id = NULL,
        lease_expires_at = NULL, reason = NULL,
        run_after = CASE WHEN p_cause = 'retry'
                         THEN now() + make_interval(secs => p_delay)
                         ELSE run_after END,
        error = COALESCE(p_error, error),
        traceback = COALESCE(p_traceback, traceback),
        failures = failures + (p_cause = 'retry')::integer,
        stalls = stalls + (p_cause = 'stall')::integer
    WHERE id = p_id;
END
$$;

-- The one way back to Queued: a release (no failure), a retry after a handler error
-- (one failure more, due again after p_delay seconds), or a stall found by lease
-- recovery (one stall more). An item whose dedup key another Queued item holds is
-- superseded by it instead (it ends Cancelled), so a requeue never wedges on the dedup
-- index. Takes the locked Running row; does not settle its scope (callers do).
-- Returns the status the item ended in, or 'Running' when a sibling with its dedup
-- key is being enqueued right now (try again).
CREATE FUNCTION work_requeue_row(
    p_id bigint, p_cause text, p_delay double precision, p_error text,
    p_traceback text DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    key text;
    sibling bigint;
    was_timeout text := current_setting('lock_timeout');
BEGIN
    IF p_cause NOT IN ('release', 'retry', 'stall') THEN
        RAISE EXCEPTION 'work_requeue_row: unknown cause %', p_cause;
    END IF;
    PERFORM work_note_attempt(
        p_id, CASE p_cause WHEN 'retry' THEN 'retried' WHEN 'release' THEN 'released'
                           ELSE 'stalled' END,
        COALESCE(p_error, CASE WHEN p_cause = 'stall' THEN 'lease expired' END), p_traceback);
    SELECT dedup_key INTO key FROM work_items WHERE id = p_id;
    IF key IS NOT NULL THEN
        SELECT q.id INTO sibling FROM work_items AS q
        WHERE q.dedup_key = key AND q.status = 'Queued' AND q.id <> p_id;
    END IF;
    IF key IS NULL THEN
        PERFORM work_requeue_update(p_id, p_cause, p_delay, p_error, p_traceback);
        RETURN 'Queued';
    ELSIF sibling IS NULL THEN
        BEGIN
            -- An uncommitted sibling makes the dedup index wait for its commit.
            PERFORM set_config('lock_timeout', '200ms', true);
            PERFORM work_requeue_update(p_id, p_cause, p_delay, p_error, p_traceback);
            PERFORM set_config('lock_timeout', was_timeout, true);
            RETURN 'Queued';
        EXCEPTION
            WHEN unique_violation THEN
                SELECT q.id INTO sibling FROM work_items AS q
                WHERE q.dedup_key = key AND q.status = 'Queued' AND q.id <> p_id;
                IF sibling IS NULL THEN
                    RAISE;
                END IF;
            WHEN lock_not_available THEN
                RETURN 'Running';
        END;
    END IF;
    UPDATE work_items
    SET status = 'Cancelled', is_head = false, worker_id = NULL, lease_expires_at = NULL,
        finished_at = now(), reason = 'superseded by queued item ' || sibling,
        error = COALESCE(p_error, error), traceback = COALESCE(p_traceback, traceback),
        failures = failures + (p_cause = 'retry')::integer,
        stalls = stalls + (p_cause = 'stall')::integer
    WHERE id = p_id;
    RETURN 'Cancelled';
END
$$;

-- Release attempts (p_cause 'release') or retry them after an error ('retry'), fenced
-- by (id, attempt): back to Queued, or superseded by a Queued item with the same dedup
-- key. An attempt that committed its success in its own transaction is passed over (no
-- row comes back for it). Returns the status each written item ended in. Its rows
-- come by primary key, as the finish's.
CREATE FUNCTION work_requeue_v1(
    p_ids bigint[], p_attempts integer[], p_cause text, p_delay double precision DEFAULT 0,
    p_error text DEFAULT NULL, p_traceback text DEFAULT NULL
) RETURNS TABLE (id bigint, status text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    was text := work_internal_begin();
    running text := 'Running';  -- a variable: see work_finish_v1
    ids bigint[];
    attempts integer[];
    r record;
    ended text;
    scopes text[] := '{}';
BEGIN
    IF p_cause NOT IN ('release', 'retry') THEN
        RAISE EXCEPTION 'work_requeue_v1: cause must be release or retry, not %', p_cause;
    END IF;
    SELECT array_agg(d.id ORDER BY d.id), array_agg(d.attempt ORDER BY d.id)
    INTO ids, attempts
    FROM (SELECT a.id, max(a.attempt) AS attempt
          FROM unnest(p_ids, p_attempts) AS a (id, attempt)
          WHERE a.id IS NOT NULL GROUP BY a.id) AS d;
    FOR r IN
        SELECT w.id, w.scope, w.run_after FROM work_items AS w
        WHERE w.id = ANY(ids) AND w.attempt = attempts[width_bucket(w.id, ids)]
          AND w.status = running AND w.completed_at IS NULL
        ORDER BY w.id
        FOR UPDATE OF w
    LOOP
        ended := work_requeue_row(r.id, p_cause, p_delay, p_error, p_traceback);
        id := r.id;
        status := ended;
        RETURN NEXT;
        scopes := scopes || r.scope;
        IF ended = 'Queued' AND r.scope IS NULL AND p_cause = 'release' THEN
            PERFORM pg_notify('trioworker', '');
        END IF;
    END LOOP;
    PERFORM work_settle_scopes(scopes);
    PERFORM work_internal_end(was);
END
$$;

-- -- the finish of a batch and the next claim, in one round trip -------------------------

-- A Worker that finishes a batch of completions while it has free slots finishes them
-- and claims for those slots in one call, one statement and one commit instead of two.
-- It is the two transitions called one after the other, nothing else: the finish of
-- work_finish_v1 (Succeeded, rows another transaction holds passed over, as a batch of
-- completions is finished), then the claim of work_claim_v1, which sees the items just
-- finished as finished (their scopes and kinds have room again), and whose scopes the
-- caller gives as the claim statement does (after asking the failover guard). A race
-- the claim loses (a slot index, a limit) rolls back the finish with it, and the caller
-- calls again. It runs as its caller (SECURITY INVOKER): calling it is calling both
-- transitions, which takes EXECUTE on each. The ids finished (`finished`, no item), then
-- the items claimed (`item`, no id).
CREATE FUNCTION work_finish_and_claim_v1(
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
                 FROM work_claim_v1(p_worker, p_lease, p_limit, p_kinds, p_scopes, p_unscoped)
                      AS c;
END
$$;

-- -- lease recovery ----------------------------------------------------------------------

-- Lease recovery: Running items whose lease expired count a stall and go back to
-- Queued (work_requeue_row), or fail as stalled at p_max_stalls, or end Cancelled when
-- their cancel was requested. One that committed its success in its own transaction is
-- finished Succeeded (no stall counted, its Worker kept on the row, so its history reads
-- `succeeded` as any success's does). An expired row is taken FOR NO KEY UPDATE SKIP
-- LOCKED (the lock its UPDATE takes anyway, so a foreign key's share lock does not make
-- recovery pass it over); one another transaction holds is left for next time, and
-- work_held_leases_v1 names it once it has been held a whole lease past its expiry.
CREATE FUNCTION work_recover_v1(p_max_stalls integer, p_batch integer)
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
        WHERE w.status = 'Running' AND (w.kind_slot IS NOT NULL OR w.kind_slot IS NULL)
          AND w.lease_expires_at < now()
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
        WHERE w.status = 'Running' AND (w.kind_slot IS NOT NULL OR w.kind_slot IS NULL)
          AND w.lease_expires_at < now()
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

-- -- an operator's: cancel, retry, pause and resume, limits ------------------------------

-- Cancel a Queued item at once, or ask a Running one to stop (its next heartbeat says
-- so). Returns the item's status after it, or NULL if it had already finished, does not
-- exist, or its attempt committed its success in its own transaction (durable: it
-- counts as finished).
CREATE FUNCTION work_request_cancel_v1(p_id bigint) RETURNS text
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
DECLARE
    was text := work_internal_begin();
    r record;
BEGIN
    UPDATE work_items
    SET status = CASE WHEN status = 'Queued' THEN 'Cancelled' ELSE status END,
        finished_at = CASE WHEN status = 'Queued' THEN now() ELSE finished_at END,
        reason = CASE WHEN status = 'Queued' THEN 'cancelled before it ran' ELSE reason END,
        is_head = false,
        cancel_requested = true
    WHERE id = p_id AND status IN ('Queued', 'Running') AND completed_at IS NULL
    RETURNING status, scope INTO r;
    IF r.status = 'Cancelled' THEN
        PERFORM work_settle_scopes(ARRAY[r.scope]);
    END IF;
    PERFORM work_internal_end(was);
    RETURN r.status;
END
$$;

-- An operator's retry: finished items back to Queued with a fresh attempt budget
-- (failures and stalls back to zero), due now, each with its mark in the item's
-- history: one more attempt number, noted as `operator-retry` (no Worker ran it), and
-- the reason the item waits with (neither column is one the triggers watch). Only
-- Failed or Cancelled items are retried; one whose dedup key a Queued item holds is
-- left as it is, and so is one another transaction holds. Returns the ids retried.
CREATE FUNCTION work_retry_v1(p_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
AS $$
DECLARE
    was text := work_internal_begin();
    r record;
    scopes text[] := '{}';
BEGIN
    FOR r IN
        SELECT w.id, w.scope, w.dedup_key, w.attempt FROM work_items AS w
        WHERE w.id = ANY(p_ids) AND w.status IN ('Failed', 'Cancelled')
        ORDER BY w.id
        FOR UPDATE OF w SKIP LOCKED
    LOOP
        CONTINUE WHEN r.dedup_key IS NOT NULL AND EXISTS (
            SELECT 1 FROM work_items AS q
            WHERE q.dedup_key = r.dedup_key AND q.status = 'Queued');
        UPDATE work_items
        SET status = 'Queued', is_head = false, run_after = now(), finished_at = NULL,
            failures = 0, stalls = 0, cancel_requested = false,
            worker_id = NULL, lease_expires_at = NULL, attempt = r.attempt + 1,
            reason = 'retried by an operator after attempt ' || r.attempt
        WHERE id = r.id;
        INSERT INTO work_attempts (item_id, attempt, worker_id, started_at, outcome)
        VALUES (r.id, r.attempt + 1, NULL, NULL, 'operator-retry');
        scopes := scopes || r.scope;
        IF r.scope IS NULL THEN
            PERFORM pg_notify('trioworker', '');
        END IF;
        RETURN NEXT r.id;
    END LOOP;
    PERFORM work_settle_scopes(scopes);
    PERFORM work_internal_end(was);
END
$$;

-- Pause a kind or a scope (claims pass it over; Running work goes on), taking the
-- scope's settle lock to take its heads down.
CREATE FUNCTION work_pause_v1(p_kind text, p_scope text) RETURNS boolean
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

CREATE FUNCTION work_resume_v1(p_kind text, p_scope text) RETURNS boolean
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET jit = off SET enable_seqscan = off
 AS $$
DECLARE
    was text := work_internal_begin();
    removed boolean;
BEGIN
    DELETE FROM work_pauses
    WHERE kind IS NOT DISTINCT FROM p_kind AND scope IS NOT DISTINCT FROM p_scope;
    removed := FOUND;
    IF p_scope IS NOT NULL THEN
        PERFORM work_settle_scopes(ARRAY[p_scope]);
    ELSIF removed THEN
        PERFORM pg_notify('trioworker', '');
    END IF;
    PERFORM work_internal_end(was);
    RETURN removed;
END
$$;

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

-- A kind's limit as its handler declares it (Registry.handler(limit=, rate=)), put in
-- force by a Worker as it starts: the running limit and rate become exactly these (a
-- NULL part: none; both NULL is refused), unless they are already. The limit the kind
-- had before (NULL columns: none), and whether it was written. Only a kind's limit:
-- the Worker's role may call it, not work_set_limit_v1. Two Workers declaring the
-- same kind at once: the second sees the first's row (its insert conflicted) and tries
-- again.
CREATE FUNCTION work_declare_limit_v1(
    p_kind text, p_running integer, p_rate integer, p_per double precision,
    OUT running integer, OUT rate integer, OUT per double precision, OUT written boolean
)
LANGUAGE plpgsql AS $$
DECLARE
    old work_limits;
BEGIN
    IF p_kind IS NULL OR (p_running IS NULL AND p_rate IS NULL) THEN
        RAISE EXCEPTION 'a declared limit is a kind''s running limit, rate, or both'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR try IN 1..2 LOOP
        BEGIN
            SELECT * INTO old FROM work_limits AS l
            WHERE l.kind = p_kind AND l.scope IS NULL FOR UPDATE;
            running := old.running;
            rate := old.rate;
            per := EXTRACT(EPOCH FROM old.per)::float8;
            written := old.id IS NULL OR old.running IS DISTINCT FROM p_running
                       OR old.rate IS DISTINCT FROM p_rate OR per IS DISTINCT FROM p_per;
            IF written THEN
                PERFORM work_set_limit_v1(p_kind, NULL, COALESCE(p_running, 0),
                                          COALESCE(p_rate, 0), p_per);
            END IF;
            RETURN;
        EXCEPTION WHEN unique_violation THEN
            IF try = 2 THEN
                RAISE;
            END IF;
        END;
    END LOOP;
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

-- -- keeping heads: settle, repair -------------------------------------------------------

-- Settle up to `p_limit` scopes noted in work_unsettled_scopes. Returns how many.
CREATE FUNCTION work_settle_noted_v1(p_limit integer) RETURNS integer
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

-- The check that must always find nothing: free scopes (with room under their limit),
-- not paused and not waiting to be settled, with a line whose first item is not a head
-- (a wedge). Each one found is settled; returns the scopes repaired. A repair is a bug
-- in the rules above made visible (the Workers log and count it), never a path the
-- queue relies on.
CREATE FUNCTION work_repair_v1(p_limit integer) RETURNS TABLE (scope text, promoted integer)
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

-- -- retention ---------------------------------------------------------------------------

-- One bounded batch of retention (a Worker's `run --retain`, an operator's `prune`; a
-- function, so no role needs DELETE on work_items, of any row): the oldest
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

-- =====================================================================================
-- Last: pin the functions to the schema and secure the transitions (the post-apply
-- hooks run both again after every `migrate`, for what a later migration adds).
-- =====================================================================================

-- In a DO block: yoyo prints the rows of a migration's SELECT.
DO $$ BEGIN PERFORM work_pin_search_path(); PERFORM work_secure_transitions(); END $$;
