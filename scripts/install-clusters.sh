#!/usr/bin/env bash
# What the HA and pooling tests (tests/integration/test_clusters.py) start their clusters
# with: Debian's pgbouncer and pg_auto_failover (/usr/bin/pg_autoctl and its extension)
# for the PostgreSQL 15 under /usr/lib/postgresql/15, from the distribution's own
# packages (nothing is downloaded from anywhere else), and the unprivileged OS user the
# clusters run as (PostgreSQL, pg_autoctl and pgbouncer all refuse to run as root).
# Idempotent: does nothing when all are there.
#
#   scripts/install-clusters.sh      (as root, or with sudo available)
set -euo pipefail

user=trioworker-test
bin=/usr/lib/postgresql/15/bin

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    sudo=(sudo)
fi

if [ ! -x "$bin/initdb" ]; then
    echo "install-clusters: no PostgreSQL 15 under $bin (Debian's postgresql-15)" >&2
    exit 1
fi
if [ ! -x /usr/sbin/pgbouncer ] || [ ! -x /usr/bin/pg_autoctl ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "install-clusters: no apt-get here; install pgbouncer and" \
            "postgresql-15-auto-failover by hand" >&2
        exit 1
    fi
    echo "install-clusters: installing pgbouncer and postgresql-15-auto-failover" \
        "with apt-get ..." >&2
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
        pgbouncer postgresql-15-auto-failover >/dev/null
    /usr/sbin/pgbouncer --version >&2
    /usr/bin/pg_autoctl --version >&2
fi
if ! id "$user" >/dev/null 2>&1; then
    "${sudo[@]}" useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
fi
