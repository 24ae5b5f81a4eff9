"""Real clusters for the HA and pooling tests, started and torn down by the tests.

- `streaming_pair()`: a primary and an asynchronous streaming standby (the lost-commit
  case), with `cut_replication()`, `kill_primary()`, `promote_standby()`.
- `auto_failover()`: a pg_auto_failover monitor and two data nodes, with a planned
  switchover and crashes of the primary.
- `pgbouncer(server_dsn)`: PgBouncer in transaction pooling mode in front of a server,
  with the server-side connection counts.
- `lone_node(also_listen_on=..., trust=...)`: one server that also listens on another
  address of this host (a network namespace's link: tests/support/netns.py).

Every program runs as the unprivileged `trioworker-test` account when the tests run as
root, from Debian's packages (scripts/install-clusters.sh installs them). Layout:
`_processes` (the account, programs, process trees), `_node` (one data directory),
then one module per harness. See docs/reliability.md, "Test clusters".
"""

from ._auto_failover import Formation, auto_failover
from ._node import Node, lone_node, multi_host_dsn
from ._pgbouncer import PgBouncer, pgbouncer
from ._processes import SERVICE_USER, ClusterError, kill_tree
from ._streaming import StreamingPair, streaming_pair

__all__ = [
    "SERVICE_USER",
    "ClusterError",
    "Formation",
    "Node",
    "PgBouncer",
    "StreamingPair",
    "auto_failover",
    "kill_tree",
    "lone_node",
    "multi_host_dsn",
    "pgbouncer",
    "streaming_pair",
]
