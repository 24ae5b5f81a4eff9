"""`Client` is generated from `AsyncClient` (scripts/generate-sync-client): the
generated module is what the script writes now, and the script's rules."""

from __future__ import annotations

import ast
import runpy
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATOR: dict[str, Any] = runpy.run_path(str(ROOT / "scripts" / "generate-sync-client"))


def test_the_sync_client_is_what_the_generator_writes_from_the_async_one() -> None:
    """trioworker/_postgres/sync_client.py is stale unless it is exactly what the script
    writes from async_client.py now."""
    wanted = GENERATOR["generate"]()
    current = (ROOT / GENERATOR["TARGET"]).read_text(encoding="utf-8")
    assert current == wanted, (
        f"{GENERATOR['TARGET']} is stale: run `.venv/bin/python scripts/generate-sync-client`"
    )


def test_the_generator_turns_each_async_form_into_its_sync_one() -> None:
    """async def, async with, async for, await and async comprehensions lose their
    async; the names of NAMES are renamed wherever they stand; `@sync_docstring` gives
    the sync docstring and is dropped, with its import."""
    source = textwrap.dedent('''
        """The async module."""
        from trioworker._postgres.clients import ALock, asleep, sync_docstring

        @sync_docstring("The sync class.")
        class AsyncClient:
            """The async class."""

            async def __aenter__(self, conn: psycopg.AsyncConnection[Any]) -> None:
                async with ALock():
                    await asleep(1)
                async for row in conn.rows():
                    pass
                return [x async for x in await drive.run_async(conn)]
    ''')
    expected = textwrap.dedent('''
        """{docstring}"""
        from trioworker._postgres.clients import Lock, sleep

        class Client:
            """The sync class."""

            def __enter__(self, conn: psycopg.Connection[Any]) -> None:
                with Lock():
                    sleep(1)
                for row in conn.rows():
                    pass
                return [x for x in drive.run_sync(conn)]
    ''').format(docstring=GENERATOR["DOCSTRING"])
    generated = GENERATOR["to_sync"](source)
    assert generated.startswith(GENERATOR["HEADER"])
    assert _code(generated) == _code(expected)


@pytest.mark.parametrize(
    ("source", "refusal"),
    [
        ("x = asyncio.Event()", r"line 1: asyncio \(no sync name in NAMES\)"),
        ("def f(a: AsyncThing) -> None: ...", r"line 1: AsyncThing \(no sync name in NAMES\)"),
        ("@sync_docstring(TEXT)\nclass C: ...", r"line 1: @sync_docstring takes one literal"),
    ],
)
def test_the_generator_refuses_what_it_cannot_make_sync(source: str, refusal: str) -> None:
    """A name still saying async (it needs a sync name in NAMES) or a sync docstring
    that is not a literal string stops the generator, naming the line."""
    with pytest.raises(GENERATOR["GeneratorError"], match=refusal):
        GENERATOR["to_sync"](source)


def _code(text: str) -> str:
    """`text` as the stdlib's unparser writes it: its layout aside."""
    return ast.unparse(ast.parse(text))
