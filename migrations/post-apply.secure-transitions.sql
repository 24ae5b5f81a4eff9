-- Run by yoyo after every `migrate` that applied anything (a post-apply hook: never
-- recorded as applied). It makes every version of the queue's transitions SECURITY
-- DEFINER, pinned to the schema and not PUBLIC's to execute, including those a later
-- migration added or replaced (migrations/0011.roles.sql says why; docs/roles.md says
-- who may call which).
-- In a DO block: yoyo prints the rows of a migration's SELECT.
-- A migration run that stops short of 0011.roles (a database brought to an earlier
-- release's schema, as tests/support/database.py's migrate_until does) has no such
-- function yet, and nothing it would secure: the hook then does nothing.
DO $$
BEGIN
    IF to_regprocedure('work_secure_transitions()') IS NOT NULL THEN
        PERFORM work_secure_transitions();
    END IF;
END
$$;
