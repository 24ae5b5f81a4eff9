-- The schema refuses what a Worker cannot run (issue 32; docs/design/schema.md, "Bounds").
--
-- PostgreSQL holds values Python cannot use: a timestamptz of 'infinity', of a BC date,
-- or of the year 10000 once the session's time zone is applied is a column value that
-- psycopg cannot turn into a datetime, and an integer at 2147483647 is one its next
-- `+ 1` overflows. Stored by plain SQL, one such row stopped every claim of its kind
-- (attempt + 1 out of range), every pass of lease recovery (stalls + 1), or stranded the
-- batch it was claimed with (its requested_at could not be read, so no item of the
-- batch ran). From here, every column a claim, lease recovery, `show`, `status` or the
-- dashboard reads is bounded, and a write that would store a value out of bounds is
-- refused by the bound's name (SQLSTATE 23514, as a CHECK's), as a payload nested 65
-- deep already is:
--
-- * Times are finite, from 1900 to 9000 (UTC). Python's datetime holds the years 1 to
--   9999 in every time zone but within a day of either end; the centuries of margin are
--   for whatever a reader adds to a time. No honest time is near either end: the queue writes now() and now() + a lease, enqueue takes a time
--   within 366 days of now, and a clock reset to 1970 still fits. Two columns keep
--   '-infinity' as the sentinel they were made with (a rate slot never used, a failover
--   guard that holds nothing); only SQL reads them.
-- * Counters (attempt, stalls, failures) are set to at most 1,000,000,000 and only
--   ever grow past it by one at a time (a claim, a stall, a failure): see
--   work_items_counters_bounded below.
-- * A failover guard's lease and a Worker's advertisement interval are finite, at most
--   a week: SQL turns both into intervals, which NaN and Infinity cannot be.
--
-- Rows stored before this migration are moved into bounds (the end of the file) before
-- the CHECKs, added NOT VALID, are validated; the triggers test only what is written.
-- depends: 0007.completed

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

-- -- work_items -----------------------------------------------------------------------
--
-- The bounds of a time are written out (no function: PostgreSQL would inline one again
-- for every statement), and a row's times are tested together: the earliest of them
-- (LEAST passes over NULLs, so an unset time is no time) is not before 1900, the latest
-- not after 9000.

-- The times an item is asked for (an enqueue writes them, a retry moves run_after),
-- which the claim, the heartbeats and the finish never write, so never test.
CREATE TRIGGER work_items_asked_times_in_range
    BEFORE INSERT OR UPDATE OF requested_at, run_after ON work_items
    FOR EACH ROW WHEN (LEAST(NEW.requested_at, NEW.run_after) < '1900-01-01 00:00:00+00'
                       OR GREATEST(NEW.requested_at, NEW.run_after) > '9000-01-01 00:00:00+00')
    EXECUTE FUNCTION work_refuse_row(
        'work_items_asked_times_in_range',
        'requested_at and run_after are finite times from 1900 to 9000 (UTC)',
        'id', 'requested_at', 'run_after');

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

-- -- the other tables: written far less often than an item, so CHECKs -------------------

ALTER TABLE work_attempts ADD CONSTRAINT work_attempts_times_in_range
    CHECK (LEAST(started_at, ended_at) >= '1900-01-01 00:00:00+00'
           AND GREATEST(started_at, ended_at) <= '9000-01-01 00:00:00+00') NOT VALID;
ALTER TABLE work_workers ADD CONSTRAINT work_workers_times_in_range
    CHECK (LEAST(started_at, last_seen, stopped_at) >= '1900-01-01 00:00:00+00'
           AND GREATEST(started_at, last_seen, stopped_at) <= '9000-01-01 00:00:00+00')
    NOT VALID;
-- (NaN is above every number in PostgreSQL's order, so `<=` refuses it, as Infinity.)
ALTER TABLE work_workers ADD CONSTRAINT work_workers_advertise_every_sane
    CHECK (advertise_every > 0 AND advertise_every <= 604800) NOT VALID;
ALTER TABLE work_schedules ADD CONSTRAINT work_schedules_times_in_range
    CHECK (LEAST(next_due, last_due, updated_at) >= '1900-01-01 00:00:00+00'
           AND GREATEST(next_due, last_due, updated_at) <= '9000-01-01 00:00:00+00')
    NOT VALID;
ALTER TABLE work_pauses ADD CONSTRAINT work_pauses_times_in_range
    CHECK (paused_at BETWEEN '1900-01-01 00:00:00+00' AND '9000-01-01 00:00:00+00')
    NOT VALID;
ALTER TABLE work_limits ADD CONSTRAINT work_limits_times_in_range
    CHECK (updated_at BETWEEN '1900-01-01 00:00:00+00' AND '9000-01-01 00:00:00+00')
    NOT VALID;
ALTER TABLE work_unsettled_scopes ADD CONSTRAINT work_unsettled_scopes_times_in_range
    CHECK (noted_at BETWEEN '1900-01-01 00:00:00+00' AND '9000-01-01 00:00:00+00')
    NOT VALID;
ALTER TABLE work_rate_slots ADD CONSTRAINT work_rate_slots_times_in_range
    CHECK (started_at = '-infinity'
           OR started_at BETWEEN '1900-01-01 00:00:00+00' AND '9000-01-01 00:00:00+00')
    NOT VALID;
ALTER TABLE work_failover_guard ADD CONSTRAINT work_failover_guard_times_in_range
    CHECK (held_until = '-infinity'
           OR held_until BETWEEN '1900-01-01 00:00:00+00' AND '9000-01-01 00:00:00+00')
    NOT VALID;
ALTER TABLE work_failover_guard ADD CONSTRAINT work_failover_guard_lease_sane
    CHECK (lease <= 604800) NOT VALID;

-- -- rows stored before this migration --------------------------------------------------
--
-- Moved into bounds, keeping what they meant: a time before 1900 becomes 1900, one after
-- 9000 becomes 9000 (an item due 'infinity' is still never due), but a lease or a
-- failover hold past 9000 ends now (no Worker could have taken it; kept, it would hold
-- its scope, or every scope, for seven thousand years) and a hold before 1900 is no
-- hold ('-infinity'); a counter over the bound becomes the bound; a guard's lease that
-- is not a number of seconds up to a week becomes 0 (the next claim raises it to its
-- own lease); an advertisement interval that is not one becomes NULL (the Worker is
-- judged by the fixed window, as one that does not say). The repairs are the
-- migration's own: each table is read once, and again by its VALIDATE below.

-- (A time moved into bounds; dropped once they hold.)
CREATE FUNCTION work_time_into_range(p_time timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE
RETURN CASE WHEN p_time < '1900-01-01 00:00:00+00' THEN '1900-01-01 00:00:00+00'
            WHEN p_time > '9000-01-01 00:00:00+00' THEN '9000-01-01 00:00:00+00'
            ELSE p_time END;

DO $$
DECLARE
    moved integer;
    report text[] := '{}';
BEGIN
    UPDATE work_items
    SET requested_at = work_time_into_range(requested_at),
        run_after = work_time_into_range(run_after),
        lease_expires_at = CASE WHEN lease_expires_at > '9000-01-01 00:00:00+00' THEN now()
                                ELSE work_time_into_range(lease_expires_at) END,
        heartbeat_at = work_time_into_range(heartbeat_at),
        started_at = work_time_into_range(started_at),
        finished_at = work_time_into_range(finished_at),
        completed_at = work_time_into_range(completed_at),
        attempt = LEAST(attempt, 1000000000),
        stalls = LEAST(stalls, 1000000000),
        failures = LEAST(failures, 1000000000)
    WHERE LEAST(requested_at, run_after, lease_expires_at, heartbeat_at, started_at,
                finished_at, completed_at) < '1900-01-01 00:00:00+00'
       OR GREATEST(requested_at, run_after, lease_expires_at, heartbeat_at, started_at,
                   finished_at, completed_at) > '9000-01-01 00:00:00+00'
       OR GREATEST(attempt, stalls, failures) > 1000000000;
    GET DIAGNOSTICS moved = ROW_COUNT;
    report := report || format('%s work_items', moved);

    UPDATE work_attempts
    SET started_at = work_time_into_range(started_at),
        ended_at = work_time_into_range(ended_at)
    WHERE NOT (LEAST(started_at, ended_at) >= '1900-01-01 00:00:00+00'
               AND GREATEST(started_at, ended_at) <= '9000-01-01 00:00:00+00');
    GET DIAGNOSTICS moved = ROW_COUNT;
    report := report || format('%s work_attempts', moved);

    UPDATE work_workers
    SET started_at = work_time_into_range(started_at),
        last_seen = work_time_into_range(last_seen),
        stopped_at = work_time_into_range(stopped_at),
        advertise_every = CASE WHEN advertise_every > 0 AND advertise_every <= 604800
                               THEN advertise_every END
    WHERE NOT (LEAST(started_at, last_seen, stopped_at) >= '1900-01-01 00:00:00+00'
               AND GREATEST(started_at, last_seen, stopped_at) <= '9000-01-01 00:00:00+00')
       OR NOT (advertise_every > 0 AND advertise_every <= 604800);
    GET DIAGNOSTICS moved = ROW_COUNT;
    report := report || format('%s work_workers', moved);

    UPDATE work_schedules
    SET next_due = work_time_into_range(next_due),
        last_due = work_time_into_range(last_due),
        updated_at = work_time_into_range(updated_at)
    WHERE NOT (LEAST(next_due, last_due, updated_at) >= '1900-01-01 00:00:00+00'
               AND GREATEST(next_due, last_due, updated_at) <= '9000-01-01 00:00:00+00');
    GET DIAGNOSTICS moved = ROW_COUNT;
    report := report || format('%s work_schedules', moved);

    UPDATE work_pauses SET paused_at = work_time_into_range(paused_at)
    WHERE paused_at IS DISTINCT FROM work_time_into_range(paused_at);
    GET DIAGNOSTICS moved = ROW_COUNT;
    report := report || format('%s work_pauses', moved);

    UPDATE work_limits SET updated_at = work_time_into_range(updated_at)
    WHERE updated_at IS DISTINCT FROM work_time_into_range(updated_at);
    GET DIAGNOSTICS moved = ROW_COUNT;
    report := report || format('%s work_limits', moved);

    UPDATE work_unsettled_scopes SET noted_at = work_time_into_range(noted_at)
    WHERE noted_at IS DISTINCT FROM work_time_into_range(noted_at);
    GET DIAGNOSTICS moved = ROW_COUNT;
    report := report || format('%s work_unsettled_scopes', moved);

    UPDATE work_rate_slots SET started_at = work_time_into_range(started_at)
    WHERE started_at <> '-infinity'
      AND started_at IS DISTINCT FROM work_time_into_range(started_at);
    GET DIAGNOSTICS moved = ROW_COUNT;
    report := report || format('%s work_rate_slots', moved);

    UPDATE work_failover_guard
    SET held_until = CASE WHEN held_until > '9000-01-01 00:00:00+00' THEN now()
                          WHEN held_until < '1900-01-01 00:00:00+00' THEN '-infinity'
                          ELSE held_until END,
        lease = CASE WHEN lease <= 604800 THEN lease ELSE 0 END
    WHERE held_until > '9000-01-01 00:00:00+00'
       OR (held_until < '1900-01-01 00:00:00+00' AND held_until <> '-infinity')
       OR NOT lease <= 604800;
    GET DIAGNOSTICS moved = ROW_COUNT;
    report := report || format('%s work_failover_guard', moved);

    RAISE NOTICE '0008.bounds: rows moved into bounds: %', array_to_string(report, ', ');
END
$$;

DROP FUNCTION work_time_into_range(timestamptz);

-- A repaired limit leaves work_limits_settle (deferred to the commit) pending, and a table
-- with pending trigger events cannot be altered: it runs now, and is deferred again once
-- the CHECKs are validated.
SET CONSTRAINTS work_limits_settle IMMEDIATE;

ALTER TABLE work_attempts VALIDATE CONSTRAINT work_attempts_times_in_range;
ALTER TABLE work_workers VALIDATE CONSTRAINT work_workers_times_in_range;
ALTER TABLE work_workers VALIDATE CONSTRAINT work_workers_advertise_every_sane;
ALTER TABLE work_schedules VALIDATE CONSTRAINT work_schedules_times_in_range;
ALTER TABLE work_pauses VALIDATE CONSTRAINT work_pauses_times_in_range;
ALTER TABLE work_limits VALIDATE CONSTRAINT work_limits_times_in_range;
ALTER TABLE work_unsettled_scopes VALIDATE CONSTRAINT work_unsettled_scopes_times_in_range;
ALTER TABLE work_rate_slots VALIDATE CONSTRAINT work_rate_slots_times_in_range;
ALTER TABLE work_failover_guard VALIDATE CONSTRAINT work_failover_guard_times_in_range;
ALTER TABLE work_failover_guard VALIDATE CONSTRAINT work_failover_guard_lease_sane;

SET CONSTRAINTS work_limits_settle DEFERRED;
