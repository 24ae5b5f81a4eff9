-- A scope's limit and whether it is full, in PL/pgSQL (issue 23): the same answers,
-- at half the server's CPU an item with 50 busy scopes.
--
-- Both were SQL functions with a subquery in their body, which PostgreSQL never
-- inlines. A claim asks work_scope_full of every scope head it reads (about 50 a claim
-- with 50 scopes), and each asked work_scope_running_limit twice. On PostgreSQL 15 a
-- SQL function called from inside another's body is parsed and planned again at every
-- call; a PL/pgSQL function keeps its plans for the session. Measured with 2 Workers
-- and 10,000 items over 50 scopes (docs/benchmarks.md): server CPU 0.91 -> 0.49 ms an
-- item, 1,430 -> 2,040 items/s; unscoped unchanged.
--
-- Same snapshot as before: a STABLE function, in either language, sees its caller's.
-- depends: 0005.edges

-- A scope's running limit: its own, else the default for scopes, else 1.
CREATE OR REPLACE FUNCTION work_scope_running_limit(p_scope text) RETURNS integer
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN COALESCE((SELECT l.running FROM work_limits AS l WHERE l.scope = p_scope),
                    (SELECT l.running FROM work_limits AS l
                     WHERE l.kind IS NULL AND l.scope IS NULL),
                    1);
END
$$;

-- Whether `p_scope` has as many Running items as its limit allows (not counting item
-- `p_except`, one being changed by hand); the limit read once.
CREATE OR REPLACE FUNCTION work_scope_full(p_scope text, p_except bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    allowed integer := work_scope_running_limit(p_scope);
BEGIN
    RETURN (SELECT count(*) FROM (
                SELECT 1 FROM work_items AS r
                WHERE r.scope = p_scope AND r.status = 'Running'
                  AND r.id IS DISTINCT FROM p_except
                LIMIT allowed) AS held) >= allowed;
END
$$;
