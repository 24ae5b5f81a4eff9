#!/usr/bin/env bash
# Profile one `python -m trioworker run` Worker over N no-op items with py-spy, and say
# where its CPU goes (docs/benchmarks.md, "Where a Worker's CPU goes").
#
#   scripts/profile-worker.sh [--items N] [--scopes S] [--concurrency C] [--out FILE]
#
# Needs py-spy in the venv (.venv/bin/pip install py-spy) and, to attach to its child,
# root or ptrace rights. It makes and drops its own database on the server at
# $TRIOWORKER_DSN's host (default 127.0.0.1, user postgres). The raw profile (collapsed
# stacks) goes to FILE (default bench/results/profile-worker.raw); the breakdown by
# part of the per-item path is printed by scripts/profile_categories.py.
set -euo pipefail
cd "$(dirname "$0")/.."
items=30000 scopes=0 concurrency=128 out=bench/results/profile-worker.raw
while [ $# -gt 0 ]; do
    case "$1" in
        --items) items=$2; shift 2 ;;
        --scopes) scopes=$2; shift 2 ;;
        --concurrency) concurrency=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "profile-worker: unknown option $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$(dirname "$out")"
admin=(psql -qAt -h 127.0.0.1 -U postgres)
db=trioworker_profile_$$
"${admin[@]}" -d postgres -c "CREATE DATABASE $db"
trap '"${admin[@]}" -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"' EXIT
dsn="host=127.0.0.1 user=postgres dbname=$db"
.venv/bin/python -m trioworker --dsn "$dsn" migrate >/dev/null
.venv/bin/py-spy record --rate 250 --format raw --output "$out" -- \
    .venv/bin/python -m trioworker --dsn "$dsn" --log-level WARNING run \
    --app bench.apps:registry --concurrency "$concurrency" &
spy=$!
until [ "$("${admin[@]}" -d "$db" -c "SELECT count(*) FROM work_workers")" = 1 ]; do sleep 0.2; done
"${admin[@]}" -d "$db" -c "INSERT INTO work_items (kind, scope)
    SELECT 'Noop', CASE WHEN $scopes > 0 THEN 's-' || mod(g, $scopes) END
    FROM generate_series(1, $items) AS g"
begun=$(date +%s.%N)
until [ "$("${admin[@]}" -d "$db" -c "SELECT count(*) FROM work_items WHERE status <> 'Succeeded'")" = 0 ]; do
    sleep 0.1
done
ended=$(date +%s.%N)
worker=$(pgrep -P "$spy")
kill -TERM "$worker"
wait "$spy" || true
python3 -c "print(f'{$items / ($ended - $begun):,.0f} items/s under py-spy')"
.venv/bin/python scripts/profile_categories.py "$out"
