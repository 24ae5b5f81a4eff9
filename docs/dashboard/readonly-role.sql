-- The dashboard's read-only role, trioworker_dashboard: SELECT on the tables the
-- dashboard reads (and on the migration bookkeeping, which it checks at start), and
-- nothing else: no write, no table of the applications. See roles.md and dashboard.md.
--
-- Run as a superuser (or the owner of the tables with CREATEROLE), connected to the
-- queue's database, AFTER `python -m trioworker migrate` (the tables must exist). Safe
-- to run again; run it again if a later version's dashboard reads another table.

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'trioworker_dashboard') THEN
        CREATE ROLE trioworker_dashboard LOGIN;
    END IF;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO trioworker_dashboard', current_database());
END
$$;

-- Its sessions start read-only too: a write fails even if someone grants one later.
ALTER ROLE trioworker_dashboard SET default_transaction_read_only = on;

-- The queue's schema as roles.sql makes it (`trioworker`); without it, `public`.
SET search_path = trioworker, public;
DO $$
BEGIN
    IF to_regnamespace('trioworker') IS NOT NULL THEN
        GRANT USAGE ON SCHEMA trioworker TO trioworker_dashboard;
        ALTER ROLE trioworker_dashboard SET search_path = trioworker;
    END IF;
END
$$;

GRANT SELECT ON TABLE work_items, work_attempts, work_workers, work_schedules, work_pauses,
    work_limits, work_rate_slots, work_steps, work_dependencies, _yoyo_migration
    TO trioworker_dashboard;
