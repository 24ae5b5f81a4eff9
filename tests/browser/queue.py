"""A populated queue for the browser tests: items in every state, made by a live Worker.

The rows go in as plain SQL (as any application may enqueue); a real Worker process of
tests/browser/app.py then runs them, so Running items heartbeat, failures carry real
tracebacks and work_attempts its real history. `settled` waits until the queue stops
changing: three Crawls run for minutes, everything else due is done.
"""

from __future__ import annotations

from typing import Any

import psycopg

Conn = psycopg.Connection[Any]
APP = "tests.browser.app:registry"

SETUP = """
SELECT work_pause_v1(NULL, 'album-9'), work_pause_v1('Report', NULL);
INSERT INTO work_items (kind, scope, payload) VALUES
    ('Crawl', 'cfg-1', '{"root": "/srv/photos"}'),
    ('Crawl', 'cfg-2', '{"root": "/srv/music"}'),
    ('Crawl', 'cfg-3', '{"root": "/srv/video"}');
INSERT INTO work_items (kind, scope, payload) VALUES
    ('Crawl', 'cfg-1', '{"root": "/srv/photos/2024"}'),
    ('Crawl', 'cfg-1', '{"root": "/srv/photos/2025"}'),
    ('Crawl', 'cfg-2', '{"root": "/srv/music/live"}'),
    ('Transcode', 'video-1', '{"file": "holiday.mkv"}'),
    ('Transcode', NULL, '{"file": "trailer.mov"}');
INSERT INTO work_items (kind, scope, payload)
SELECT 'Thumbnail', CASE WHEN n % 3 = 0 THEN NULL ELSE 'album-' || (n % 4) END,
       jsonb_build_object('seconds', 0.05, 'photo', 'IMG_' || n || '.jpg')
FROM generate_series(1, 12) AS n;
INSERT INTO work_items (kind, scope, payload, run_after)
SELECT 'Thumbnail', 'album-5', jsonb_build_object('photo', 'later-' || n || '.jpg'),
       now() + make_interval(mins => 30 + n)
FROM generate_series(1, 4) AS n;
INSERT INTO work_items (kind, scope, payload) VALUES
    ('Thumbnail', 'album-9', '{"photo": "held-1.jpg"}'),
    ('Thumbnail', 'album-9', '{"photo": "held-2.jpg"}'),
    ('Report', NULL, '{"month": "2026-11"}'),
    ('Backup', 'nas-1', '{}'), ('Backup', 'nas-2', '{}'), ('Backup', NULL, '{}'),
    ('Report', NULL, '{"month": "2026-10", "superseded": true}');
SELECT work_request_cancel_v1(id) FROM work_items WHERE payload ->> 'superseded' = 'true';
INSERT INTO work_workers (id, host, pid, started_at, last_seen, stopped_at, kinds, scopes,
                          unscoped, concurrency)
VALUES ('old-box-1', 'old-box', 4242, now() - interval '3 hours', now() - interval '1 hour',
        NULL, '{Crawl,Thumbnail}', '{cfg-1,cfg-2}', false, 2),
       ('night-shift', 'batch-7', 777, now() - interval '9 hours', now() - interval '2 hours',
        now() - interval '2 hours', '{Backup}', NULL, true, 1);
"""


def populate(pg: Conn) -> None:
    pg.execute(SETUP)  # type: ignore[call-overload]


def settled(pg: Conn) -> bool:
    """Whether the Worker has done all it will: three Crawls running, the due
    Thumbnails done, both Transcodes failed after their two attempts."""
    row = pg.execute(
        """
        SELECT count(*) FILTER (WHERE status = 'Running' AND kind = 'Crawl'),
               count(*) FILTER (WHERE status = 'Failed'),
               count(*) FILTER (WHERE status = 'Queued' AND kind = 'Thumbnail'
                                AND run_after <= now() AND scope IS DISTINCT FROM 'album-9'),
               (SELECT count(*) FROM work_schedules)
        FROM work_items
        """
    ).fetchone()
    return row == (3, 2, 0, 1)


def counts(pg: Conn) -> dict[tuple[str, str], int]:
    rows = pg.execute("SELECT kind, status, count(*) FROM work_items GROUP BY 1, 2").fetchall()
    return {(kind, status): n for kind, status, n in rows}


def ids(pg: Conn, where: str) -> set[int]:
    return {r[0] for r in pg.execute(f"SELECT id FROM work_items WHERE {where}").fetchall()}  # type: ignore[call-overload]


def one(pg: Conn, query: str, params: Any = None) -> Any:
    row = pg.execute(query, params).fetchone()  # type: ignore[call-overload]
    assert row is not None
    return row[0]
