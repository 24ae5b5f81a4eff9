-- Least-privilege roles for trioworker: run ONCE, as a superuser (or a role with
-- CREATEROLE that owns the database), connected to the queue's database. See roles.md.
--
--   trioworker_migrator  owns the schema `trioworker`; runs `python -m trioworker migrate`.
--   trioworker_worker    runs Workers (and enqueues): reads and writes rows, no DDL.
--
-- The dashboard's read-only role (trioworker_dashboard) comes after `migrate`, from
-- docs/dashboard/readonly-role.sql (roles.md says why it is a script of its own).
--
-- Set their passwords afterwards (psql: \password trioworker_worker), then, as the
-- migrator, run `migrate` and docs/grants.sql.

CREATE ROLE trioworker_migrator LOGIN;
CREATE ROLE trioworker_worker LOGIN;

-- The queue's tables live in a schema the migrator owns: only the owner can change them.
CREATE SCHEMA trioworker AUTHORIZATION trioworker_migrator;
GRANT USAGE ON SCHEMA trioworker TO trioworker_worker;
ALTER ROLE trioworker_migrator SET search_path = trioworker;
ALTER ROLE trioworker_worker SET search_path = trioworker;

-- Nobody else may create objects in `public` (the default since PostgreSQL 15; older
-- servers let every role do so). Drop this line if other applications rely on it.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;

DO $$
BEGIN
    EXECUTE format(
        'GRANT CONNECT ON DATABASE %I TO trioworker_migrator, trioworker_worker',
        current_database()
    );
END
$$;
