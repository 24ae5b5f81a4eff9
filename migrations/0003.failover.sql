-- The failover guard (docs/design/failover.md, ADR 0012).
--
-- With asynchronous replication, a claim the old primary acknowledged can be missing
-- on the promoted standby: there its scope looks free, and a second attempt could
-- start while the first still runs its handler (it stops only when its heartbeat
-- finds no Running row, or at its self-stop). So the database notes the timeline each
-- claim runs on; the first claim on a new timeline (a promotion, a switchover, a
-- point-in-time restore) holds claims of scoped work for one lease, the longest any
-- claim has taken. Every attempt that may have run on the old timeline has then
-- stopped: its last heartbeat there was sent before the promotion, its handler is
-- cancelled half a lease after that, and Settings keep half the lease + the stop
-- grace under one lease (the bound lease recovery relies on too). Unscoped work goes
-- on: the rule does not cover it.
--
-- The claim statement calls work_failover_hold_v1 (trioworker/_postgres/queries.sql,
-- `claim`): while it answers true, the claim is asked for no scopes ('{}'), so it
-- takes unscoped items alone. The claim function itself is unchanged.
-- depends: 0002.limits

-- One row: the timeline the last claims ran on, the longest lease a claim has taken,
-- and until when claims of scoped work wait.
CREATE TABLE work_failover_guard (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    timeline bigint NOT NULL,
    lease double precision NOT NULL DEFAULT 0 CHECK (lease >= 0),
    held_until timestamptz NOT NULL DEFAULT '-infinity'
);

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
