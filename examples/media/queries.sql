-- Every statement the media library sends, each under a `-- name:` header (parsed in
-- examples/media/_db.py). Handlers run them only in the Worker's fenced transactions
-- (`ctx.transaction()`), so an attempt that lost its item writes nothing.

-- name: config
SELECT id, owner, root, proxy_root, removed_at
FROM media_storage_configs WHERE id = %(config_id)s;

-- name: add_config
INSERT INTO media_storage_configs (id, owner, root, proxy_root)
VALUES (%(config_id)s, %(owner)s, %(root)s, %(proxy_root)s)
ON CONFLICT (id) DO UPDATE
SET owner = EXCLUDED.owner, root = EXCLUDED.root, proxy_root = EXCLUDED.proxy_root,
    removed_at = NULL;

-- name: remove_config
UPDATE media_storage_configs SET removed_at = now()
WHERE id = %(config_id)s AND removed_at IS NULL;

-- name: active_hashes
SELECT content_hash FROM media_assets
WHERE config_id = %(config_id)s AND status = 'Active';

-- name: register_asset
-- A new active asset and its proxies, in one statement. Nothing when the content is
-- already active in the config (a duplicate file within one crawl).
WITH asset AS (
    INSERT INTO media_assets (config_id, content_hash, path, size, captured_at)
    VALUES (%(config_id)s, %(content_hash)s, %(path)s, %(size)s, %(captured_at)s)
    ON CONFLICT (config_id, content_hash) WHERE status = 'Active' DO NOTHING
    RETURNING id
)
INSERT INTO media_proxies (asset_id, kind, path)
SELECT asset.id, p.kind, p.path
FROM asset, unnest(%(kinds)s::text[], %(paths)s::text[]) AS p(kind, path);

-- name: soft_deleted
SELECT id, content_hash FROM media_assets
WHERE config_id = %(config_id)s AND status = 'SoftDeleted'
ORDER BY id;

-- name: content_is_active
SELECT EXISTS (
    SELECT 1 FROM media_assets
    WHERE config_id = %(config_id)s AND content_hash = %(content_hash)s AND status = 'Active'
) AS active;

-- name: content_is_known
-- Whether any asset of the config, active or soft-deleted, still has this content.
SELECT EXISTS (
    SELECT 1 FROM media_assets
    WHERE config_id = %(config_id)s AND content_hash = %(content_hash)s
) AS known;

-- name: purge_asset
DELETE FROM media_assets WHERE id = %(asset_id)s AND status = 'SoftDeleted';

-- name: soft_delete
-- What a user's delete in the app does: the asset is hidden, its files stay until purge.
UPDATE media_assets SET status = 'SoftDeleted', deleted_at = now()
WHERE id = ANY(%(asset_ids)s::bigint[]) AND status = 'Active'
RETURNING id;

-- name: pick_active
SELECT id FROM media_assets
WHERE config_id = %(config_id)s AND status = 'Active'
ORDER BY random() LIMIT %(limit)s;

-- name: captures
SELECT id, captured_at FROM media_assets
WHERE config_id = %(config_id)s AND status = 'Active'
ORDER BY captured_at, id;

-- name: clear_bursts
DELETE FROM media_bursts WHERE config_id = %(config_id)s;

-- name: add_burst
WITH burst AS (
    INSERT INTO media_bursts (config_id, started_at, ended_at, size)
    VALUES (%(config_id)s, %(started_at)s, %(ended_at)s, %(size)s)
    RETURNING id
)
UPDATE media_assets AS a SET burst_id = burst.id
FROM burst
WHERE a.id = ANY(%(asset_ids)s::bigint[]) AND a.config_id = %(config_id)s;

-- name: live_configs
SELECT id, proxy_root FROM media_storage_configs WHERE removed_at IS NULL ORDER BY id;

-- name: add_token
INSERT INTO media_share_tokens (token, config_id, expires_at)
VALUES (%(token)s, %(config_id)s, now() + make_interval(secs => %(seconds)s));

-- name: delete_expired_tokens
DELETE FROM media_share_tokens WHERE expires_at < now();

-- name: active_assets_with_proxies
-- Every active asset of a live config, with the proxies it has rows for (the audit's
-- input; a removed config's proxies are deleted on purpose).
SELECT a.id, a.config_id, a.content_hash, c.proxy_root,
       coalesce(array_agg(p.kind ORDER BY p.kind) FILTER (WHERE p.kind IS NOT NULL), '{}') AS kinds,
       coalesce(array_agg(p.path ORDER BY p.kind) FILTER (WHERE p.kind IS NOT NULL), '{}') AS paths
FROM media_assets AS a
JOIN media_storage_configs AS c ON c.id = a.config_id
LEFT JOIN media_proxies AS p ON p.asset_id = a.id
WHERE a.status = 'Active' AND c.removed_at IS NULL
  AND a.config_id = ANY(%(config_ids)s::text[])
GROUP BY a.id, c.proxy_root
ORDER BY a.id;

-- name: library_summary
-- Per config: active and soft-deleted assets, bursts, live share tokens.
SELECT c.id AS config_id, c.owner,
       (SELECT count(*) FROM media_assets a
        WHERE a.config_id = c.id AND a.status = 'Active') AS active,
       (SELECT count(*) FROM media_assets a
        WHERE a.config_id = c.id AND a.status = 'SoftDeleted') AS soft_deleted,
       (SELECT count(*) FROM media_bursts b WHERE b.config_id = c.id) AS bursts,
       (SELECT count(*) FROM media_share_tokens t WHERE t.config_id = c.id) AS tokens
FROM media_storage_configs AS c
WHERE c.id = ANY(%(config_ids)s::text[])
ORDER BY c.id;

-- name: queue_by_scope
-- The demo's view of the queue: items per scope, kind and status.
SELECT coalesce(scope, '') AS scope, kind, status, count(*) AS n
FROM work_items GROUP BY 1, 2, 3;

-- name: running
SELECT id, kind, coalesce(scope, '') AS scope, worker_id FROM work_items
WHERE status = 'Running' ORDER BY started_at;

-- name: held_back
-- Queued items, due now, whose scope has an item Running: the rule holds them back.
SELECT q.id FROM work_items AS q
WHERE q.status = 'Queued' AND q.run_after <= now() AND q.scope IS NOT NULL
  AND EXISTS (SELECT 1 FROM work_items AS r WHERE r.scope = q.scope AND r.status = 'Running');
