-- Usage: psql -h 127.0.0.1 -U postgres -d DB -f scripts/measure-fence-cost.sql, on a scratch
-- database migrated by this tree (it deletes every item). Issue 32: the fence and the
-- completion became functions (work_fence_v1, work_complete_v1) at the same cost.
-- In-server cost of the fence and the completion (server time only, no client): 2000
-- distinct Running items a round, each fenced and completed once, inline statements
-- against the functions, alternating, 6 rounds each, in a transaction rolled back.
DELETE FROM work_items; VACUUM work_items;
INSERT INTO work_items (kind) SELECT 'K' FROM generate_series(1, 24000);
SELECT count(*) FROM work_claim_v3('m', 3600, 24000, ARRAY['K']);
DO $$
DECLARE
    ids bigint[] := ARRAY(SELECT id FROM work_items WHERE status = 'Running' ORDER BY id);
    t0 timestamptz; n integer := 0; ok boolean; inline float8[] := '{}'; fn float8[] := '{}';
    x bigint;
BEGIN
    FOR round IN 1..12 LOOP
        t0 := clock_timestamp();
        FOR k IN 1..2000 LOOP
            n := n + 1; x := ids[n];
            IF round % 2 = 1 THEN
                PERFORM FROM work_items AS w WHERE w.id = x AND w.attempt = 1 AND w.status = 'Running' FOR NO KEY UPDATE;
                ok := FOUND;
                UPDATE work_items AS w SET completed_at = COALESCE(w.completed_at, statement_timestamp())
                WHERE w.id = x AND w.attempt = 1 AND w.status = 'Running';
                ok := FOUND;
            ELSE
                ok := work_fence_v1(x, 1);
                ok := work_complete_v1(x, 1);
            END IF;
        END LOOP;
        IF round % 2 = 1 THEN inline := inline || extract(epoch FROM clock_timestamp() - t0) * 1e6 / 2000;
        ELSE fn := fn || extract(epoch FROM clock_timestamp() - t0) * 1e6 / 2000; END IF;
    END LOOP;
    RAISE NOTICE 'fence + complete, us an item: inline % (rounds %), functions % (rounds %)',
        round((SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY v) FROM unnest(inline) v)::numeric, 1), inline,
        round((SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY v) FROM unnest(fn) v)::numeric, 1), fn;
    RAISE EXCEPTION 'rolled back on purpose';
END $$;
