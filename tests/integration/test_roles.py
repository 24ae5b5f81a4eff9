"""The least-privilege roles of docs/roles.md, set up as an operator sets them up.

docs/roles.sql as a superuser, `migrate` as the migrator, docs/grants.sql as the
migrator, each twice (each is safe to run again). Then: each role may run exactly the
statements of queries.sql its work needs (MAY_RUN); every write a role must not make is
refused (FORBIDDEN, each listed once); the transitions alone run as the schema's owner,
pinned to it and closed to PUBLIC; and each role's work runs end to end: an
application's (the CLI, Client, AsyncClient, a plain INSERT), a Worker's (connected
directly and through PgBouncer), an operator's (the CLI and the dashboard's actions).
Roles are cluster-wide: each setup names its own (tests/support/roles.py).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.browser.support import TOKEN, dashboards, request
from tests.integration.test_cli import trioworker
from tests.integration.test_clients import run_asyncio
from tests.support.clusters import pgbouncer
from tests.support.database import Databases, migrate_until
from tests.support.processes import kill_workers, wait_for, workers
from tests.support.roles import RoleSetup
from trioworker import AsyncClient, CancelOutcome, Client, NewItem, Status, StoreError
from trioworker._postgres.queries import WRITTEN

Conn = psycopg.Connection[Any]
CLIENT, WORKER, OPERATOR = "trioworker_client", "trioworker_worker", "trioworker_operator"
ANYONE = (CLIENT, WORKER, OPERATOR)
APP = "tests.apps.roles:registry"


@pytest.fixture(scope="module")
def queue_roles(databases: Databases) -> Iterator[RoleSetup]:
    """One database with the roles set up, and a few items, for the tests that only try
    statements (each in a transaction rolled back)."""
    roles = RoleSetup()
    try:
        with databases.database(migrated=False) as roles.db_dsn:
            roles.set_up()
            with psycopg.connect(roles.dsn(CLIENT), autocommit=True) as client:
                client.execute(
                    "INSERT INTO work_items (kind, scope)"
                    " VALUES ('K', 's'), ('K', 's'), ('K', NULL)"
                )
            yield roles
    finally:
        roles.drop(databases.admin_dsn)


@pytest.fixture
def roles(databases: Databases) -> Iterator[RoleSetup]:
    """A database of the test's own with the roles set up."""
    roles = RoleSetup()
    try:
        with databases.database(migrated=False) as roles.db_dsn:
            roles.set_up()
            yield roles
    finally:
        roles.drop(databases.admin_dsn)


@pytest.fixture
def empty_roles(databases: Databases) -> Iterator[RoleSetup]:
    """An empty database of the test's own with docs/roles.sql applied (twice)."""
    roles = RoleSetup()
    try:
        with databases.database(migrated=False) as roles.db_dsn:
            for _ in range(2):
                roles.run("roles.sql")
            yield roles
    finally:
        roles.drop(databases.admin_dsn)


def tried(roles: RoleSetup, role: str, statement: str | sql.Composable, params: Any = None) -> None:
    """Run `statement` as `role` in a transaction that is rolled back, with what it
    deferred to the commit (a constraint trigger) run too, as a commit would."""
    with psycopg.connect(roles.dsn(role)) as conn, conn.transaction(force_rollback=True):
        conn.execute(statement, params)  # type: ignore[arg-type]
        conn.execute("SET CONSTRAINTS ALL IMMEDIATE")


# -- each role runs exactly the statements its work needs ------------------------------

#: The statements of queries.sql an application's work needs (enqueue, read, cancel).
APPLICATIONS = [
    "enqueue",
    "enqueue_many",
    "queued_with_dedup_keys",
    "queued_with_dedup_key",
    "request_cancel",
    "status_of",
    "get_item",
    "attempts",
    "result_state",
    "step",
    "steps",
    "unknown_items",
    "parent_results",
    "family",
    "counts_by_kind_and_status",
    "running_items",
    "busy_scopes",
    "recent_failures",
    "workers",
    "unserved_kinds",
    "worker_holding",
    "schedules",
    "next_schedule_due",
    "pauses",
    "limits",
    "wait_facts",
    "failed_items",
    "count_finished",
    "kind_seen",
    "kinds_served",
    "scope_holder",
    "seconds_until_due",
    "channels",
    "listen",
    "listen_probe",
    "notify_probe",
    "unlisten_probe",
]
#: Those a Worker's work needs besides.
WORKERS = [
    "claim",
    "heartbeat",
    "heartbeat_many",
    "lock_attempt",
    "complete_in_transaction",
    "complete_in_transaction_result",
    "finish",
    "finish_and_claim",
    "finish_result",
    "record_step",
    "requeue",
    "recover_expired_leases",
    "held_leases",
    "settle_noted_scopes",
    "repair_heads",
    "advertise_worker",
    "worker_stopped",
    "sync_schedule",
    "due_schedules",
    "fired_schedule",
]
#: Those an operator's work needs besides.
OPERATORS = ["set_limit", "clear_limit", "pause", "resume", "retry_items"]
#: Which roles may run each statement of queries.sql; the others are refused.
MAY_RUN: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(APPLICATIONS, ANYONE),
    **dict.fromkeys(WORKERS, (WORKER,)),
    **dict.fromkeys(OPERATORS, (OPERATOR,)),
    "delete_finished": (WORKER, OPERATOR),  # retention, and `prune`
    "declare_limit": (WORKER,),  # a kind's limit its handler declares, at the Worker's start
}

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
#: Parameters for every statement: two items of one scope where a batch is asked for
#: (the second one's place in the line is confirmed at the commit).
PARAMS: dict[str, Any] = {
    "kind": "K", "scope": "s", "payload": "{}", "priority": 0, "dedup_key": None,
    "run_at": None, "delay": 0.0, "trace_context": None, "kinds": ["K", "K"],
    "scopes": ["s", "s"], "payloads": ["{}", "{}"], "priorities": [0, 0],
    "dedup_keys": [None, None], "run_ats": [None, None], "delays": [0.0, 0.0],
    "trace_contexts": [None, None], "unscoped": True, "id": 1, "ids": [1], "attempt": 1,
    "attempts": [1], "limit": 10, "batch": 10, "worker_id": "w", "lease": 30.0,
    "status": "Succeeded", "reason": None, "error": None, "traceback": None, "wait": True,
    "cause": "release", "max_stalls": 3, "since": T0, "after": T0, "statuses": ["Succeeded"],
    "older_than": 3600.0, "name": "n", "names": ["n"], "spec": "every 1", "specs": ["every 1"],
    "next_due": T0, "due": T0, "item": None, "host": "h", "pid": 1, "gone_pid": 0,
    "concurrency": 1, "advertise_every": 1.0, "alive_beats": 3, "alive_within": 30.0,
    "running": 2, "rate": None, "per": None, "result": '{"a": 1}', "results": ['{"a": 1}'],
    "parents": None, "parent_lists": [None, None],
}  # fmt: skip
#: Where a statement takes a parameter of that name otherwise: a Worker's id is text,
#: and a limit or a pause is of a kind or of a scope.
OVERRIDES: dict[str, dict[str, Any]] = {
    **{name: {"id": "w"} for name in ["advertise_worker", "worker_holding", "worker_stopped"]},
    **{name: {"kind": None} for name in ["set_limit", "clear_limit", "pause", "resume"]},
}


def test_every_statement_is_given_to_the_roles_whose_work_needs_it() -> None:
    """A statement added to queries.sql must be given its roles here."""
    assert sorted(MAY_RUN) == sorted(WRITTEN)


@pytest.mark.parametrize(
    ("name", "role"), [(name, role) for name in sorted(MAY_RUN) for role in ANYONE]
)
def test_each_role_may_run_exactly_the_statements_its_work_needs(
    queue_roles: RoleSetup, name: str, role: str
) -> None:
    """Allowed: it runs (and what it defers to the commit runs too); else refused."""
    statement: str | sql.Composable = WRITTEN[name]
    if name == "listen":
        statement = sql.SQL(WRITTEN[name]).format(channel=sql.Identifier("trioworker"))
    params = {**PARAMS, **OVERRIDES.get(name, {})}
    if role in MAY_RUN[name]:
        tried(queue_roles, role, statement, params)
    else:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            tried(queue_roles, role, statement, params)


# -- every forbidden write -------------------------------------------------------------

ITEM = "(SELECT min(id) FROM work_items)"
#: Every write a role must not make, and the roles refused it (insufficient_privilege).
FORBIDDEN: list[tuple[str, tuple[str, ...]]] = [
    # An item's transitions and bookkeeping are the queue's functions' alone.
    ("UPDATE work_items SET status = 'Succeeded', finished_at = now()", ANYONE),
    ("UPDATE work_items SET status = 'Cancelled', finished_at = now()", ANYONE),
    ("UPDATE work_items SET priority = 1000, run_after = now()", ANYONE),
    ("UPDATE work_items SET is_head = true", ANYONE),
    ("UPDATE work_items SET attempt = 2147483647", ANYONE),
    ("UPDATE work_items SET stalls = 2147483647", ANYONE),
    ("UPDATE work_items SET cancel_requested = true", ANYONE),
    ("UPDATE work_items SET payload = '{}', kind = 'Other', scope = 'other'", ANYONE),
    ("UPDATE work_items SET lease_expires_at = 'infinity'", (CLIENT, OPERATOR)),
    ("UPDATE work_items SET completed_at = now()", (CLIENT, OPERATOR)),
    ("SELECT id FROM work_items FOR UPDATE", (CLIENT, OPERATOR)),
    ("SELECT id FROM work_items FOR KEY SHARE", (CLIENT, OPERATOR)),
    ("DELETE FROM work_items", ANYONE),
    ("SELECT * FROM work_delete_finished_v1('{Queued}', '-infinity', 0, 10)", (CLIENT,)),
    ("TRUNCATE work_items CASCADE", ANYONE),
    # Results and steps: a Worker's transitions write them, fenced; nobody else.
    ("UPDATE work_items SET result = '{}'", ANYONE),
    ("INSERT INTO work_items (kind, result) VALUES ('K', '{}')", ANYONE),
    (f"INSERT INTO work_steps (item_id, name, attempt) VALUES ({ITEM}, 'n', 1)", ANYONE),
    ("UPDATE work_steps SET result = '1'", ANYONE),
    ("DELETE FROM work_steps", ANYONE),
    ("TRUNCATE work_steps", ANYONE),
    (f"SELECT * FROM work_finish_result_v1(ARRAY[{ITEM}], ARRAY[0], ARRAY['1'::jsonb])",
     (CLIENT, OPERATOR)),
    (f"SELECT * FROM work_complete_result_v1({ITEM}, 0, '1')", (CLIENT, OPERATOR)),
    (f"SELECT work_record_step_v1({ITEM}, 0, 'n', '1')", (CLIENT, OPERATOR)),
    # An insert is a Queued item with no attempt, lease, slot, result or id of its own.
    ("INSERT INTO work_items (kind, status) VALUES ('K', 'Succeeded')", ANYONE),
    ("INSERT INTO work_items (kind, status, worker_id, lease_expires_at)"
     " VALUES ('K', 'Running', 'w', 'infinity')", ANYONE),
    ("INSERT INTO work_items (kind, attempt) VALUES ('K', 2147483647)", ANYONE),
    ("INSERT INTO work_items (kind, stalls) VALUES ('K', 2147483647)", ANYONE),
    ("INSERT INTO work_items (kind, failures) VALUES ('K', 2147483647)", ANYONE),
    ("INSERT INTO work_items (kind, scope, is_head) VALUES ('K', 's', true)", ANYONE),
    ("INSERT INTO work_items (kind, scope, scope_slot) VALUES ('K', 's', 1)", ANYONE),
    ("INSERT INTO work_items (kind, requested_at) VALUES ('K', 'infinity')", ANYONE),
    ("INSERT INTO work_items (kind, cancel_requested) VALUES ('K', true)", ANYONE),
    ("INSERT INTO work_items (kind, reason, error) VALUES ('K', 'done', 'none')", ANYONE),
    ("INSERT INTO work_items (id, kind) VALUES (9000000000, 'K')", ANYONE),
    # Dependencies: an insert names its parents (`after`); the rest is the schema's.
    ("INSERT INTO work_items (kind, status) VALUES ('K', 'Waiting')", ANYONE),
    ("INSERT INTO work_items (kind, has_children) VALUES ('K', true)", ANYONE),
    ("UPDATE work_items SET after = NULL", ANYONE),
    ("UPDATE work_items SET has_children = false", ANYONE),
    (f"INSERT INTO work_dependencies (child_id, parent_id) VALUES ({ITEM}, {ITEM})", ANYONE),
    ("UPDATE work_dependencies SET parent_id = parent_id", ANYONE),
    ("DELETE FROM work_dependencies", ANYONE),
    ("INSERT INTO work_unsettled_waiting (item_id) VALUES (1)", ANYONE),
    ("DELETE FROM work_unsettled_waiting", ANYONE),
    ("SELECT work_settle_noted_v2(10)", (CLIENT, OPERATOR)),
    ("SELECT * FROM work_delete_finished_v2('{Queued}', '-infinity', 0, 10)", (CLIENT,)),
    (f"SELECT work_settle_waiting(ARRAY[{ITEM}], true)", ANYONE),
    # The attempt history.
    (f"INSERT INTO work_attempts (item_id, attempt, outcome) VALUES ({ITEM}, 9, 'x')", ANYONE),
    ("UPDATE work_attempts SET outcome = 'succeeded'", ANYONE),
    ("DELETE FROM work_attempts", ANYONE),
    # Limits: an operator's, through their functions.
    ("INSERT INTO work_limits (scope, running) VALUES ('s', 10000)", ANYONE),
    ("UPDATE work_limits SET running = 10000", ANYONE),
    ("DELETE FROM work_limits", ANYONE),
    ("UPDATE work_rate_slots SET started_at = '-infinity'", ANYONE),
    ("DELETE FROM work_rate_slots", ANYONE),
    ("SELECT * FROM work_set_limit_v1(NULL, 's', 10000)", (CLIENT, WORKER)),
    ("SELECT work_clear_limit_v1(NULL, 's')", (CLIENT, WORKER)),
    ("SELECT * FROM work_declare_limit_v1('K', 10000, NULL, NULL)", (CLIENT, OPERATOR)),
    # Pauses and retries: an operator's, through their functions.
    ("INSERT INTO work_pauses (scope) VALUES ('s')", ANYONE),
    ("DELETE FROM work_pauses", ANYONE),
    ("SELECT work_pause_v1(NULL, 's')", (CLIENT, WORKER)),
    ("SELECT work_resume_v1(NULL, 's')", (CLIENT, WORKER)),
    (f"SELECT * FROM work_retry_v1(ARRAY[{ITEM}])", (CLIENT, WORKER)),
    # The failover guard: a claim's, through its function.
    ("UPDATE work_failover_guard SET held_until = '-infinity'", ANYONE),
    ("DELETE FROM work_failover_guard", ANYONE),
    ("INSERT INTO work_failover_guard (timeline, held_until) VALUES (0, '-infinity')", ANYONE),
    ("SELECT work_failover_hold_v1(0)", (CLIENT, OPERATOR)),
    # Workers' registrations and schedules: a Worker's own.
    ("INSERT INTO work_workers (id, host, pid, kinds, unscoped, concurrency)"
     " VALUES ('fake', 'h', 1, '{K}', true, 100)", (CLIENT, OPERATOR)),
    ("UPDATE work_workers SET last_seen = 'infinity'", (CLIENT, OPERATOR)),
    ("DELETE FROM work_workers", ANYONE),
    ("INSERT INTO work_schedules (name, kind, spec, next_due) VALUES ('n', 'K', 'x', now())",
     (CLIENT, OPERATOR)),
    ("UPDATE work_schedules SET next_due = now()", (CLIENT, OPERATOR)),
    ("DELETE FROM work_schedules", ANYONE),
    ("INSERT INTO work_unsettled_scopes (scope) VALUES ('s')", ANYONE),
    ("DELETE FROM work_unsettled_scopes", ANYONE),
    ("INSERT INTO work_spent_scopes VALUES ('s', now() + interval '1 day')", ANYONE),
    ("UPDATE work_spent_scopes SET reopens_at = now() + interval '1 day'", ANYONE),
    ("DELETE FROM work_spent_scopes", ANYONE),
    # (A lock on a row of it would hold up the settle that deletes the row.)
    ("SELECT scope FROM work_spent_scopes FOR KEY SHARE", ANYONE),
    # The queue's own locks (work_settle_locks, work_claim_locks): only the transitions take
    # them, so no role can hold a stripe and stop claims or settles.
    ("SELECT stripe FROM work_claim_locks FOR UPDATE", ANYONE),
    ("SELECT stripe FROM work_claim_locks FOR SHARE", ANYONE),
    ("SELECT stripe FROM work_settle_locks FOR UPDATE", ANYONE),
    ("SELECT stripe FROM work_settle_locks FOR KEY SHARE", ANYONE),
    ("INSERT INTO work_claim_locks (stripe) VALUES (100000)", ANYONE),
    ("UPDATE work_settle_locks SET stripe = stripe", ANYONE),
    ("DELETE FROM work_claim_locks", ANYONE),
    ("TRUNCATE work_settle_locks", ANYONE),
    # A Worker's own writes while an attempt runs: its heartbeat, the fence of its
    # handler's transaction and the success noted in it run as their caller, and need
    # UPDATE of the lease and completion columns, which only the Worker's role has.
    (f"SELECT * FROM work_heartbeat_v1(ARRAY[{ITEM}], ARRAY[0], 30)", (CLIENT, OPERATOR)),
    (f"SELECT * FROM work_heartbeat_v1(ARRAY[{ITEM}], ARRAY[0], 30, true)", (CLIENT, OPERATOR)),
    (f"SELECT work_fence_v1({ITEM}, 0)", (CLIENT, OPERATOR)),
    (f"SELECT work_complete_v1({ITEM}, 0)", (CLIENT, OPERATOR)),
    # Naming the leases held past every bound locks the rows it can (a Worker's).
    ("SELECT * FROM work_held_leases_v1(10)", (CLIENT, OPERATOR)),
    # A Worker's transitions.
    ("SELECT * FROM work_claim_v1('w', 30, 1, ARRAY['K'])", (CLIENT, OPERATOR)),
    (f"SELECT * FROM work_finish_v1(ARRAY[{ITEM}], ARRAY[0], 'Succeeded')", (CLIENT, OPERATOR)),
    (f"SELECT * FROM work_requeue_v1(ARRAY[{ITEM}], ARRAY[0], 'retry')", (CLIENT, OPERATOR)),
    ("SELECT * FROM work_recover_v1(3, 10)", (CLIENT, OPERATOR)),
    ("SELECT work_settle_noted_v1(10)", (CLIENT, OPERATOR)),
    ("SELECT * FROM work_repair_v1(10)", (CLIENT, OPERATOR)),
    ("SELECT * FROM work_repair_v2(10)", (CLIENT, OPERATOR)),
    # The transitions' helpers run with their caller's privileges.
    ("SELECT work_settle_scopes(ARRAY['s'])", ANYONE),
    (f"SELECT work_note_attempt({ITEM}, 'succeeded')", ANYONE),
    (f"SELECT work_requeue_row({ITEM}, 'retry', 0, NULL)", ANYONE),
    (f"SELECT work_requeue_update({ITEM}, 'retry', 0, NULL, NULL)", ANYONE),
    ("SELECT work_take_rate_slot(1, '1 s', 'x')", ANYONE),
    # The schema and the migration bookkeeping: the migrator's.
    ("ALTER TABLE work_items ADD COLUMN sneaky integer", ANYONE),
    ("DROP INDEX work_items_one_running_per_scope_slot", ANYONE),
    ("CREATE TABLE sneaky (id integer)", ANYONE),
    ("CREATE TABLE public.sneaky (id integer)", ANYONE),
    ("CREATE FUNCTION sneaky() RETURNS integer LANGUAGE sql AS 'SELECT 1'", ANYONE),
    ("DROP TRIGGER work_items_arrive ON work_items", ANYONE),
    ("ALTER FUNCTION work_finish_v1 SECURITY INVOKER", ANYONE),
    ("UPDATE _yoyo_migration SET migration_hash = migration_hash", ANYONE),
    ("DELETE FROM yoyo_lock", ANYONE),
]  # fmt: skip


@pytest.mark.parametrize(
    ("statement", "role"),
    [(statement, role) for statement, refused in FORBIDDEN for role in refused],
)
def test_every_forbidden_write_is_refused(
    queue_roles: RoleSetup, statement: str, role: str
) -> None:
    """insufficient_privilege, whatever the rows."""
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        tried(queue_roles, role, statement)


# -- the transitions run as the owner ----------------------------------------------------

#: The transitions that run as the schema's owner (work_secure_transitions).
TRANSITIONS = (
    "claim", "failover_hold", "finish", "requeue", "recover", "settle_noted", "repair",
    "request_cancel", "retry", "pause", "resume", "set_limit", "clear_limit",
    "declare_limit", "delete_finished", "finish_result", "complete_result", "record_step",
)  # fmt: skip
TRANSITION = re.compile(rf"work_({'|'.join(TRANSITIONS)})_v[0-9]+")
#: Triggers deferred to the commit, which run as the session's role, and the triggers of
#: an insert with parents (migrations/0003.dependencies.sql), which write what the
#: enqueuing role has no grant on.
DEFINER_TRIGGERS = {
    "work_items_confirm_place", "work_limits_settle", "work_items_record_parents",
    "work_items_wait_for_parents", "work_items_release_children", "work_items_after_parents",
    "work_items_keep_needed_parents",
}  # fmt: skip
#: The transitions at a later version (0003.dependencies, 0004.claim-kind-room,
#: 0005.spent-scopes), beside the first.
SECOND_VERSIONS = {
    "work_request_cancel_v2", "work_settle_noted_v2", "work_delete_finished_v2", "work_claim_v2",
    "work_claim_v3", "work_repair_v2",
}  # fmt: skip


def definers(conn: Conn, schema: str) -> dict[str, tuple[bool, bool]]:
    """Each function of `schema` run as its owner: (pinned to `schema`, PUBLIC may call)."""
    pin = f"search_path={schema}, pg_catalog, pg_temp"
    if schema == "public":  # pg_catalog first, as in a default path (work_secure_transitions)
        pin = "search_path=public, pg_temp"
    rows = conn.execute(
        "SELECT p.proname, %s = ANY(COALESCE(p.proconfig, '{}')),"
        " has_function_privilege('public', p.oid, 'EXECUTE')"
        " FROM pg_proc AS p WHERE p.pronamespace = %s::regnamespace AND p.prosecdef",
        [pin, schema],
    ).fetchall()
    return {name: (pinned, public) for name, pinned, public in rows}


def test_the_transitions_alone_run_as_the_owner_pinned_and_closed_to_public(
    queue_roles: RoleSetup, dsn: str, databases: Databases
) -> None:
    """In the roles' schema and in public (no roles set up): every version of each
    transition, and the triggers that write for the enqueuing role, run SECURITY DEFINER,
    pinned to their schema, and PUBLIC may not call one; no other function does. A
    temporary table of the caller's cannot stand in for the queue's in one, and a role
    with no grants calls none."""
    for schema, db_dsn in (("trioworker", queue_roles.db_dsn), ("public", dsn)):
        with psycopg.connect(db_dsn) as conn:
            names = [r[0] for r in conn.execute(
                "SELECT proname FROM pg_proc WHERE pronamespace = %s::regnamespace", [schema]
            )]  # fmt: skip
            expected = {n for n in names if TRANSITION.fullmatch(n)} | DEFINER_TRIGGERS
            # One version of each in the baseline (issue 32), and the versions a later
            # migration added beside it: no alias of a newer one.
            assert expected == (
                {f"work_{t}_v1" for t in TRANSITIONS} | SECOND_VERSIONS | DEFINER_TRIGGERS
            )
            assert definers(conn, schema) == dict.fromkeys(expected, (True, False)), schema

    with psycopg.connect(queue_roles.dsn(CLIENT), autocommit=True) as client:
        client.execute("CREATE TEMP TABLE work_items (LIKE trioworker.work_items)")
        client.execute("INSERT INTO pg_temp.work_items SELECT * FROM trioworker.work_items")
        with client.transaction(force_rollback=True):
            [(id,)] = client.execute("SELECT max(id) FROM trioworker.work_items").fetchall()
            [(status,)] = client.execute("SELECT work_request_cancel_v1(%s)", [id]).fetchall()
            assert status == "Cancelled"
            real = client.execute("SELECT status FROM trioworker.work_items WHERE id = %s", [id])
            temporary = client.execute("SELECT status FROM pg_temp.work_items WHERE id = %s", [id])
            assert (real.fetchone(), temporary.fetchone()) == (("Cancelled",), ("Queued",))

    nobody = f"tw_nobody_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(databases.admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(nobody)))
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn) | {"user": nobody}
        with psycopg.connect(psycopg.conninfo.make_conninfo(**params)) as conn:
            calls = [
                "SELECT work_request_cancel_v1(1)",
                "SELECT work_finish_v1('{}', '{}', 'Succeeded')",
                "SELECT work_failover_hold_v1(0)",
            ]
            for call in calls:
                with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
                    conn.execute(call)  # type: ignore[call-overload]
    finally:
        with psycopg.connect(databases.admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(nobody)))


# -- each role's work, end to end --------------------------------------------------------


def test_an_application_enqueues_reads_and_cancels_as_the_client_role(
    roles: RoleSetup, tmp_path: Path
) -> None:
    """The CLI, Client, AsyncClient and a plain INSERT enqueue (each item placed in its
    scope's line: one head); show, status and cancel work; an operator's or a Worker's
    call is refused with the database's reason."""
    dsn = roles.dsn(CLIENT)

    def cli(*args: str) -> str:
        done = trioworker(*args, dsn=dsn)
        assert done.returncode == 0, done.stderr
        return done.stdout

    ids = [int(cli("enqueue", "Record", "--scope", "s", "--payload", '{"n": 1}'))]
    lines = tmp_path / "items.jsonl"
    lines.write_text('{"kind": "Record", "scope": "s"}\n{"kind": "Record"}\n')
    ids += [int(line) for line in cli("enqueue", "--from", str(lines)).split()]
    with Client(dsn) as client:
        first = client.enqueue("Record", scope="s", dedup_key="k")
        assert client.enqueue("Record", scope="s", dedup_key="k").deduplicated
        ids += [first.id] + [e.id for e in client.enqueue_many([NewItem("Record", scope="s")])]
        shown = client.show(first.id)
        assert shown is not None and shown.item.dedup_key == "k"
        assert client.status().counts.by_kind["Record"]["Queued"] == len(ids)
        assert client.cancel(first.id) is CancelOutcome.CANCELLED
        for refused in (lambda: client.retry([first.id]), lambda: client.pause(scope="s")):
            with pytest.raises(StoreError, match="InsufficientPrivilege"):
                refused()

    async def through_asyncio() -> list[int]:
        async with AsyncClient(dsn) as client:
            made = [(await client.enqueue("Record", scope="s")).id]
            made += [e.id for e in await client.enqueue_many([NewItem("Record", scope="s")])]
            assert await client.cancel(made[0]) is CancelOutcome.CANCELLED
            assert (await client.status()).counts.by_kind["Record"]["Cancelled"] == 2
            with pytest.raises(StoreError, match="InsufficientPrivilege"):
                await client.pause(scope="s")
            return made

    ids += run_asyncio(through_asyncio)
    with psycopg.connect(dsn, autocommit=True) as conn:
        insert = (
            "INSERT INTO work_items (kind, scope, payload, priority, dedup_key, run_after)"
            " VALUES ('Record', 's', '{}', 0, 'plain', now()) ON CONFLICT (dedup_key)"
            " WHERE status = 'Queued' AND dedup_key IS NOT NULL DO NOTHING RETURNING id"
        )
        [(plain,)] = conn.execute(insert).fetchall()
        assert conn.execute(insert).fetchall() == []  # the dedup key is held
        ids.append(plain)
        heads = conn.execute(
            "SELECT count(*) FILTER (WHERE is_head), count(*) FROM work_items"
            " WHERE scope = 's' AND status = 'Queued'"
        ).fetchone()
        assert heads == (1, len(ids) - 3)  # two cancelled, one unscoped
    assert cli("show", str(plain)).startswith(f"item {plain}  Record  scope s  Queued\n")
    assert '"Queued"' in cli("status", "--json")
    assert cli("cancel", str(plain)) == f"item {plain} cancelled (it had not started)\n"
    for args in (["pause", "--scope", "s"], ["retry", str(plain)], ["limit", "--default",
                 "--running", "9"], ["prune", "--older-than", "1s"]):  # fmt: skip
        refused = trioworker(*args, dsn=dsn)
        assert refused.returncode == 1 and "permission denied" in refused.stderr, args


def test_the_client_role_enqueues_after_other_items_and_a_worker_releases_them(
    roles: RoleSetup,
) -> None:
    """Dependencies through the roles: the client role enqueues with parents (Client,
    and a plain INSERT of `after`), each child Waiting; its cancel of a Waiting child
    cascades; the Worker role's finish of the parent makes the other child Queued."""
    with Client(roles.dsn(CLIENT)) as client:
        parent = client.enqueue("Record").id
        child = client.enqueue("Record", after=[parent]).id
        with psycopg.connect(roles.dsn(CLIENT), autocommit=True) as conn:
            [(plain,)] = conn.execute(
                "INSERT INTO work_items (kind, after) VALUES ('Record', %s) RETURNING id",
                [[child]],
            ).fetchall()
            [(other,)] = conn.execute(
                "INSERT INTO work_items (kind, after) VALUES ('Record', %s) RETURNING id",
                [[parent]],
            ).fetchall()
        states = [client.get_item(i) for i in (child, plain, other)]
        assert [s.status if s else None for s in states] == [Status.WAITING] * 3
        assert client.cancel(child) is CancelOutcome.CANCELLED
        gone = client.get_item(plain)
        assert gone is not None and gone.reason == f"parent {child} was cancelled"
    with psycopg.connect(roles.dsn(WORKER), autocommit=True) as conn:
        [(id, attempt)] = conn.execute(
            "SELECT id, attempt FROM work_claim_v3('w', 30, 1, ARRAY['Record'])"
        ).fetchall()
        assert id == parent
        conn.execute("SELECT work_finish_v1(%s, %s, 'Succeeded')", [[id], [attempt]])
        [(status,)] = conn.execute("SELECT status FROM work_items WHERE id = %s", [other])
        assert status == "Queued"


def test_a_scoped_enqueue_works_between_a_migration_and_the_next_run_of_grants(
    empty_roles: RoleSetup,
) -> None:
    """0005.spent-scopes adds a table that an enqueue's trigger reads as the enqueuing
    role (work_spent_scopes, as it reads work_pauses), and the claim the Worker calls
    (work_claim_v3). A database at 0004 with that release's grants, migrated to 0005
    and grants.sql not yet run again: the client role's scoped enqueue still goes (the
    migration grants the read to every role that may read work_pauses), and the Worker
    role claims the item (and the new claim to every role that may call the old)."""
    roles = empty_roles
    migrate_until(roles.dsn("trioworker_migrator"), "0004.claim-kind-room")
    with psycopg.connect(roles.dsn("trioworker_migrator"), autocommit=True) as migrator:
        # docs/grants.sql as it was at 0004: without the table it has since.
        migrator.execute(roles.script("grants.sql").replace(" work_spent_scopes,", ""))
    done = trioworker("migrate", dsn=roles.dsn("trioworker_migrator"))
    assert done.returncode == 0 and done.stdout == "applied 0005.spent-scopes\n", done.stderr
    with psycopg.connect(roles.dsn(CLIENT), autocommit=True) as client:
        client.execute("INSERT INTO work_items (kind, scope) VALUES ('K', 's')")
    with psycopg.connect(roles.dsn(WORKER), autocommit=True) as worker:
        claimed = worker.execute(
            WRITTEN["claim"],
            dict(worker_id="w", lease=30.0, limit=1, kinds=["K"], scopes=None, unscoped=True),
        ).fetchall()
        assert worker.execute("SELECT * FROM work_repair_v2(10)").fetchall() == []
    assert [row[2] for row in claimed] == ["s"]


def test_a_worker_runs_items_end_to_end_as_the_worker_role_directly_and_through_pgbouncer(
    empty_roles: RoleSetup, tmp_path: Path
) -> None:
    """The Worker role cannot migrate; the migrator can. Then Worker processes connected
    as the Worker role, directly and through PgBouncer (transaction pooling), make every
    kind of write a Worker makes: claims of scoped and unscoped items under a scope's
    limit, a retry after an error, a fenced transaction writing the application's own
    table, an enqueue from a handler, a periodic item, retention, and lease recovery of
    an item whose Worker was killed. Nothing is refused."""
    roles = empty_roles
    worker_dsn = roles.dsn(WORKER)

    def cli(role: str, *args: str) -> str:
        done = trioworker(*args, dsn=roles.dsn(role))
        assert done.returncode == 0, done.stderr
        return done.stdout

    refused = trioworker("migrate", dsn=worker_dsn)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and "may not change the schema" in refused.stderr
    assert "applied 0005.spent-scopes" in cli("trioworker_migrator", "migrate")
    with psycopg.connect(roles.dsn("trioworker_migrator"), autocommit=True) as migrator:
        migrator.execute("CREATE TABLE results (item_id bigint, attempt integer)")  # the app's
    for _ in range(2):
        roles.run("grants.sql", as_role="trioworker_migrator")
    assert cli(WORKER, "migrate") == "schema is up to date\n"  # reading is allowed

    def enqueue(kind: str, scope: str | None = None, **payload: float) -> int:
        where = ["--scope", scope] if scope else []
        return int(cli(CLIENT, "enqueue", kind, "--payload", json.dumps(payload), *where))

    short = ["--lease", "3", "--heartbeat", "0.5", "--poll", "0.5", "--concurrency", "4"]
    with (
        workers(tmp_path) as start,
        pgbouncer(worker_dsn) as bouncer,
        psycopg.connect(roles.db_dsn, autocommit=True) as admin,
    ):
        admin.execute("SET search_path = trioworker")

        def statuses() -> dict[int, tuple[str, int]]:
            rows = admin.execute("SELECT id, status, attempt FROM work_items").fetchall()
            return {id: (status, attempt) for id, status, attempt in rows}

        ids = [enqueue("SlowFirst", "s5")]
        doomed = start(worker_dsn, *short, name="doomed", app=APP)
        wait_for(lambda: statuses()[ids[0]][0] == "Running", 60, "a claim of the slow item")
        kill_workers(doomed.proc)
        cli(OPERATOR, "limit", "--scope", "s1", "--running", "2")
        ids += [enqueue("Record", "s1", seconds=0.5), enqueue("Record", "s1", seconds=0.5),
                enqueue("Record", "s1"), enqueue("Record"), enqueue("FailOnce", "s2"),
                enqueue("Fenced", "s3"), enqueue("FollowUp", "s4")]  # fmt: skip
        # Each serves scopes of its own, so both must do their part.
        direct = start(worker_dsn, *short, "--scope", "s1", "--scope", "s2", "--unscoped",
                       name="direct", app=APP)  # fmt: skip
        pooled = start(bouncer.dsn(), *short, "--listen-dsn", worker_dsn, "--scope", "s3",
                       "--scope", "s4", "--scope", "s5", "--no-unscoped", name="pooled",
                       app=APP)  # fmt: skip

        def done() -> bool:
            now = statuses()
            kinds = dict(admin.execute(
                "SELECT kind, count(*) FROM work_items WHERE status = 'Succeeded' GROUP BY kind"
            ).fetchall())  # fmt: skip
            return (
                all(now[id][0] == "Succeeded" for id in ids)
                and kinds.get("Record") == 5  # with the follow-up's
                and kinds.keys() >= {"Tick", "trioworker.retention"}
            )

        wait_for(done, 90, "every item, a Tick and a retention run to succeed")
        users = admin.execute(
            "SELECT DISTINCT usename FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE %s",
            ["trioworker %"],
        ).fetchall()
        outputs = direct.output() + pooled.output()
        assert users == [(roles.name[WORKER],)], outputs
        assert "permission denied" not in outputs and "InsufficientPrivilege" not in outputs
        assert admin.execute("SELECT item_id FROM results").fetchall() == [(ids[6],)]
        now = statuses()  # the slow item recovered after a stall; FailOnce retried
        assert now[ids[0]] == ("Succeeded", 2) and now[ids[5]] == ("Succeeded", 2)
        ran_by = dict(admin.execute("SELECT scope, worker_id FROM work_items").fetchall())
        assert [ran_by[s] for s in ("s1", "s2", "s3", "s4", "s5")] == ["direct"] * 2 + [
            "pooled"
        ] * 3
    assert '"Succeeded"' in cli(WORKER, "status", "--json")


def test_operators_commands_run_as_the_operator_role_and_no_other(
    roles: RoleSetup, tmp_path: Path
) -> None:
    """limit, pause, resume, quiesce, cancel, retry (noted in the item's history), prune
    and status through the CLI, and the dashboard's actions, as the operator role; the
    same commands as an application's or a Worker's role are refused with the
    database's reason, and the dashboard answers 403 (but for a cancel, which an
    application may ask)."""
    operator, client = roles.dsn(OPERATOR), roles.dsn(CLIENT)

    def cli(*args: str, dsn: str = operator) -> str:
        done = trioworker(*args, dsn=dsn)
        assert done.returncode == 0, done.stderr
        return done.stdout

    ids = [int(cli("enqueue", "Record", "--scope", "s", dsn=client)) for _ in range(3)]
    assert "at most 2 Running" in cli("limit", "--scope", "s", "--running", "2")
    assert "scope s " in cli("limit") and cli("limit", "--scope", "s", "--clear")
    assert cli("pause", "--scope", "s") == "scope 's' paused\n"
    assert cli("resume", "--scope", "s") == "scope 's' resumed\n"
    assert "is quiet" in cli("quiesce", "--scope", "s", "--timeout", "1")
    assert cli("resume", "--scope", "s") == "scope 's' resumed\n"
    assert cli("cancel", str(ids[0])) == f"item {ids[0]} cancelled (it had not started)\n"
    assert cli("retry", str(ids[0])) == f"retried 1 item(s): {ids[0]}\n"
    assert "operator-retry" in cli("show", str(ids[0]), dsn=client)
    assert "deleted 0" in cli("prune", "--older-than", "1s")
    assert "would delete 0" in cli("prune", "--older-than", "1s", "--dry-run")
    assert '"Queued": 3' in cli("status", "--json")

    operators = [
        ["limit", "--scope", "s", "--running", "9"],
        ["pause", "--kind", "Record"],
        ["quiesce", "--scope", "s", "--timeout", "1"],
        ["retry", str(ids[0])],
    ]
    for role in (CLIENT, WORKER):
        for args in operators:
            refused = trioworker(*args, dsn=roles.dsn(role))
            assert refused.returncode == 1, (role, args, refused.stdout)
            assert "permission denied" in refused.stderr, (role, args)

    env = {"TRIOWORKER_DASHBOARD_TOKEN": TOKEN}
    asked = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json"}
    actions = [("pause", {"scope": "s"}), ("resume", {"scope": "s"}),
               ("limit", {"scope": "s", "running": "3"}), ("cancel", {"id": ids[1]}),
               ("retry", {"id": ids[1]}), ("quiesce", {"scope": "s", "timeout": "1"})]  # fmt: skip
    with dashboards(tmp_path) as start:
        acting, refusing = (start(dsn, "--allow-actions", env=env) for dsn in (operator, client))
        for action, form in actions:
            answer = request(f"{acting.url}/actions/{action}", "POST", form=form, headers=asked)
            assert answer.status == 200, (action, answer.body)
            if action == "cancel":  # an application's too
                answer = request(f"{refusing.url}/actions/cancel", "POST",
                                 form={"id": ids[2]}, headers=asked)  # fmt: skip
                assert answer.status == 200, answer.body
            else:
                answer = request(f"{refusing.url}/actions/{action}", "POST", form=form,
                                 headers=asked)  # fmt: skip
                assert answer.status == 403, (action, answer.body)
                assert "may not change the queue" in json.loads(answer.body)["message"]
