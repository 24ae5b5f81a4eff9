-- The queue in a schema of its own (issue 20; docs/design/schema.md).
--
-- `migrate --schema NAME` runs every migration with search_path = NAME, so the objects
-- land there; the Python side names each object schema-qualified. What is left is how
-- the functions find their tables: PL/pgSQL resolves a name with the search_path of
-- the moment it runs, which is the caller's (an application's, whose own `work_items`
-- may sit in public). So every function of the queue is pinned to its schema:
--
--     ALTER FUNCTION f SET search_path = NAME, pg_catalog, pg_temp
--
-- done by work_pin_search_path(), called at the end of this migration and again by
-- post-apply.pin-functions.sql after every `migrate` that applied anything: a function
-- a later migration adds or replaces (CREATE OR REPLACE drops the setting) is pinned
-- too, with nothing to write in that migration. The rule for migration authors: name
-- the queue's functions work_...; that is what gets pinned (IMMUTABLE ones excepted).
--
-- Without --schema, migrate runs as it always did, in the role's current schema (public,
-- or docs/roles.sql's trioworker), and the functions are pinned to that one; but in
-- public they are left as they were. There the caller's search_path already finds the
-- queue (public is on every default path, pg_catalog implicitly before it), and a pinned
-- function pays a save and restore of the setting on every call: measured 1.12x a
-- claim and 1.31x an inserted scoped row inside PostgreSQL (docs/design/schema.md).
-- An application that wants its own work_items beside the queue's gives the queue a
-- schema of its own.
--
-- NOTIFY channels are per schema: trioworker and trioworker_settle in public (as
-- before), trioworker.NAME and trioworker_settle.NAME elsewhere (work_channel). The
-- functions call pg_notify('trioworker', ...) unqualified; the pinned search_path puts
-- the schema before pg_catalog, so the call finds the pg_notify below, which sends on
-- the schema's channel. The schema holds nothing else named like a catalog object.
-- depends: 0003.failover

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

-- In a DO block: yoyo prints the rows of a migration's SELECT.
DO $$ BEGIN PERFORM work_pin_search_path(); END $$;
