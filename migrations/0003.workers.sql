-- The Workers table: each Worker advertises what it serves, and when it was last seen
-- (`status` reads it to show kinds no live Worker serves).
-- depends: 0002.scope-lines

CREATE TABLE work_workers (
    id          text        PRIMARY KEY,
    host        text        NOT NULL,
    pid         integer     NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now(),
    stopped_at  timestamptz,
    kinds       text[]      NOT NULL,
    scopes      text[],     -- NULL: every scope
    unscoped    boolean     NOT NULL,
    concurrency integer     NOT NULL
);
