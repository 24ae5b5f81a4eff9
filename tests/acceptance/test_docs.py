"""The user guide runs as written, and the site (guide and API reference) builds clean.

Every fenced block of `docs/guide/*.md` is run or checked, in page order, in a fresh
project directory with its own database (`$TRIOWORKER_DSN` points at it, and `python`
and `pytest` are this environment's):

- **A file**: any block whose first line is `# file: PATH` (`-- file: PATH` in SQL) is
  written, as shown, to PATH in the project.
- **```sh**: each line is a command, run with bash in the project; it must exit 0, or
  the status a trailing `# exits N` gives. A `python -m trioworker run ...` line ending
  `# leave it running` is started in the background (the test waits until the Worker
  has advertised itself); all of them get SIGTERM at the end of the page and must then
  exit 0. A `pip install PACKAGE[EXTRAS] ...` line is checked, not run: each package
  is installed here, and so are the requirements of each extra named (`.`, a `.whl`
  and a `pip wheel` line are this project: tests/acceptance/test_wheel.py runs those).
- **An excerpt**: a block whose first line is `# from: PATH` shows part of a file
  written before: its lines must all be in that file, in order (`...` as in output).
- **```python** (not a file): run as a script (`python -`) in the project; must exit 0.
- **```sql** (not a file): run on the page's database, in autocommit mode (a block may
  hold BEGIN ... COMMIT); the rows of its SELECTs are its output.
- **```text**: output shown to the reader. The output of the block just before it,
  then what the background Workers logged while that block ran, must show each of its
  lines, in order, compared by whole words (`...` stands for anything; see
  `tests.support.docblocks.mismatch`).
- Any other block fails the test: nothing is shown that is not run.

While a background Worker runs, each step first waits until the queue is quiet: no
Running item and no due Queued item one of the page's Workers serves. That is what a
reader who waits a moment sees, so shown output does not depend on timing.

At the end of a page the items its Workers claimed must all have finished: Succeeded
(at least one), or Failed as many as the page's `<!-- docs-test: failed N -->` says.
Other settings: `database empty` (start from an empty database, not a migrated one),
`after PAGE` (first write the files of PAGE, without running its commands).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from packaging.requirements import Requirement

import trioworker
import trioworker.testing
from tests.support.database import Databases
from tests.support.docblocks import (
    Block,
    Command,
    Page,
    commands,
    mismatch,
    pip_install,
    read_page,
)
from tests.support.processes import worker_pids

ROOT = Path(__file__).parents[2]
GUIDE = ROOT / "docs" / "guide"
PAGES = sorted(p.name for p in GUIDE.glob("*.md"))
BIN = Path(sys.executable).parent
TRIOWORKER_RUN = re.compile(r"^python -m trioworker\b.*\brun\b")
#: Seconds a step may wait for the queue to go quiet, or a Worker to start or stop.
PATIENCE = 30.0

#: No Running item, and no due Queued item that one of the given Workers serves.
BUSY = """
SELECT EXISTS (SELECT 1 FROM work_items WHERE status = 'Running')
    OR EXISTS (
        SELECT 1 FROM work_items AS i JOIN work_workers AS w
            ON i.kind = ANY (w.kinds)
           AND CASE WHEN i.scope IS NULL THEN w.unscoped
                    ELSE w.scopes IS NULL OR i.scope = ANY (w.scopes) END
        WHERE i.status = 'Queued' AND i.run_after <= now()
          AND w.stopped_at IS NULL AND w.pid = ANY (%s))
"""


class Background:
    """A Worker the page leaves running, its output in a log file."""

    def __init__(self, command: str, project: Path, env: dict[str, str], log: Path) -> None:
        self.command = command
        self.log_path = log
        with log.open("w") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                ["bash", "-c", f"exec {command}"],  # exec: the signals reach the Worker
                cwd=project,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log_path.read_text()

    def pids(self) -> list[int]:
        """`run` and its Workers (which advertise their own pids)."""
        return [self.proc.pid, *worker_pids(self.proc.pid)]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


class PageRun:
    """One page's blocks, run in order in `project` against the database `dsn`."""

    def __init__(self, page: Page, project: Path, dsn: str, logs: Path) -> None:
        self.page = page
        self.project = project
        self.dsn = dsn
        self.logs = logs
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("TRIOWORKER", "PYTEST"))},
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "TRIOWORKER_DSN": dsn,
            "COLUMNS": "120",  # rich draws tables 80 columns wide when not on a terminal
        }
        self.background: list[Background] = []
        self.last_output: str | None = None
        #: How much each Worker had logged when the last block (not output) began.
        self.log_marks: dict[int, int] = {}

    # -- the rules ---------------------------------------------------------------------

    def run(self, block: Block) -> None:
        if block.lang != "text":  # what a ```text block after this one may show
            self.log_marks = {id(b): len(b.output()) for b in self.background}
        if block.file is not None:
            self.write(block)
            self.last_output = None
        elif block.excerpt_of is not None:
            source = self.project / block.excerpt_of
            assert source.is_file(), f"{block.where}: {block.excerpt_of} was not written before"
            problem = mismatch(block.body, source.read_text())
            assert problem is None, f"{block.where}: not in {block.excerpt_of}: {problem}"
        elif block.lang == "sh":
            assert commands(block), f"{block.where}: a ```sh block with no command"
            self.last_output = "".join(self.sh(block, c) for c in commands(block))
        elif block.lang == "python":
            self.last_output = self.script(block)
        elif block.lang == "sql":
            self.last_output = self.sql(block)
        elif block.lang == "text":
            self.check_output(block)
        else:
            pytest.fail(f"{block.where}: no rule runs a ```{block.lang} block (see this module)")

    def write(self, block: Block) -> None:
        assert block.file is not None
        path = self.project / block.file
        assert self.project in path.resolve().parents, f"{block.where}: {path} is outside"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.text)

    def sh(self, block: Block, command: Command) -> str:
        packages = pip_install(command.line)
        if packages is not None:
            check_installed(packages, block)
            return ""
        if command.background:
            assert TRIOWORKER_RUN.match(command.line), f"{block.where}: only Workers run on"
            self.start(block, command.line)
            return ""
        self.settle(block.where)
        result = subprocess.run(
            ["bash", "-c", command.line],
            cwd=self.project,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        output = result.stdout + result.stderr
        assert result.returncode == command.exits, (
            f"{block.where}: `{command.line}` exited {result.returncode},"
            f" not {command.exits}:\n{output}"
        )
        return output

    def script(self, block: Block) -> str:
        self.settle(block.where)
        result = subprocess.run(
            [str(BIN / "python"), "-"],
            input=block.text,
            cwd=self.project,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, (
            f"{block.where}: the script exited {result.returncode}:\n{output}"
        )
        return output

    def sql(self, block: Block) -> str:
        self.settle(block.where)
        lines: list[str] = []
        with psycopg.connect(self.dsn, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(block.text.encode())  # bytes: not a LiteralString, and no params
            while True:
                if cur.description:
                    lines.append(" | ".join(c.name for c in cur.description))
                    for row in cur.fetchall():
                        lines.append(" | ".join("" if v is None else str(v) for v in row))
                if not cur.nextset():
                    break
        return "\n".join(lines) + "\n"

    def check_output(self, block: Block) -> None:
        assert self.last_output is not None, f"{block.where}: output shown after no command"
        assert block.text.strip(), f"{block.where}: an empty ```text block shows nothing"
        deadline = time.monotonic() + (5.0 if self.background else 0.0)
        while True:
            self.settle(block.where)
            logs = [b.output()[self.log_marks.get(id(b), 0) :] for b in self.background]
            actual = self.last_output + "".join(logs)
            problem = mismatch(block.text, actual)
            if problem is None or time.monotonic() >= deadline:
                break
            time.sleep(0.1)  # a Worker's log line may be on its way
        assert problem is None, f"{block.where}: {problem}; the output was:\n{actual}"

    # -- Workers ---------------------------------------------------------------------------

    def start(self, block: Block, command: str) -> None:
        log = self.logs / f"{self.page.name}-worker-{len(self.background) + 1}.log"
        worker = Background(command, self.project, self.env, log)
        self.background.append(worker)
        advertised = "SELECT 1 FROM work_workers WHERE pid = ANY(%s) AND stopped_at IS NULL"
        deadline = time.monotonic() + PATIENCE
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not conn.execute(advertised, [worker.pids()]).fetchone():
                assert worker.proc.poll() is None, (
                    f"{block.where}: `{command}` exited {worker.proc.returncode}:\n"
                    + worker.output()
                )
                assert time.monotonic() < deadline, f"{block.where}: the Worker never started"
                time.sleep(0.05)

    def pids(self) -> list[int]:
        return [pid for worker in self.background for pid in worker.pids()]

    def settle(self, where: str) -> None:
        """Wait until the page's Workers have nothing left to do that they could do."""
        if not self.background:
            return
        deadline = time.monotonic() + PATIENCE
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while (row := conn.execute(BUSY, [self.pids()]).fetchone()) and row[0]:
                for worker in self.background:
                    assert worker.proc.poll() is None, (
                        f"{where}: the Worker `{worker.command}` exited"
                        f" {worker.proc.returncode}:\n{worker.output()}"
                    )
                assert time.monotonic() < deadline, f"{where}: the queue never went quiet"
                time.sleep(0.05)

    def finish(self) -> None:
        """Stop the Workers as an operator does (SIGTERM), and check what they did."""
        if not self.background:
            return
        self.settle(f"{self.page.name} (at its end)")
        for worker in self.background:
            worker.proc.send_signal(signal.SIGTERM)
        for worker in self.background:
            code = worker.proc.wait(timeout=PATIENCE)
            assert code == 0, f"`{worker.command}` exited {code} on SIGTERM:\n{worker.output()}"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            claimed = dict(
                conn.execute(
                    "SELECT status, count(*) FROM work_items WHERE attempt > 0 GROUP BY status"
                ).fetchall()
            )
        failed = int(self.page.settings.get("failed", "0"))
        assert claimed.get("Succeeded", 0) >= 1, f"{self.page.name}: nothing succeeded"
        assert claimed.keys() <= {"Succeeded", "Failed"}, (
            f"{self.page.name}: the items the Workers claimed did not all finish: {claimed}"
        )
        assert claimed.get("Failed", 0) == failed, f"{self.page.name}: {claimed}"

    def close(self) -> None:
        for worker in self.background:
            worker.kill()


def check_installed(packages: list[tuple[str, list[str]]], block: Block) -> None:
    """`pip install` would install what this environment has: each package, and the
    requirements of each extra named."""
    for name, extras in packages:
        dist = importlib.metadata.distribution(name)  # raises when it is not installed
        offered = set(dist.metadata.get_all("Provides-Extra") or [])
        assert set(extras) <= offered, f"{block.where}: {name} has no extra {extras}"
        for text in dist.requires or []:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is not None and any(marker.evaluate({"extra": e}) for e in extras):
                importlib.metadata.distribution(requirement.name)


def files_of(name: str) -> Iterator[Block]:
    """The file blocks of page `name`, after those of the pages it comes after."""
    page = read_page(GUIDE / name)
    if "after" in page.settings:
        yield from files_of(page.settings["after"])
    yield from (block for block in page.blocks if block.file is not None)


@pytest.mark.parametrize("name", PAGES)
def test_every_block_of_the_guide_runs_as_written(
    name: str, databases: Databases, tmp_path: Path
) -> None:
    """Each guide page's files, commands, scripts and SQL run as the page says, and
    show the output it shows (module docstring: the rules)."""
    page = read_page(GUIDE / name)
    project = tmp_path / "project"
    project.mkdir()
    with databases.database(migrated=page.settings.get("database") != "empty") as dsn:
        run = PageRun(page, project, dsn, tmp_path)
        try:
            if "after" in page.settings:
                for block in files_of(page.settings["after"]):
                    run.write(block)
            for block in page.blocks:
                run.run(block)
            run.finish()
        finally:
            run.close()


def test_the_site_builds_with_no_warning_and_documents_every_public_name(
    tmp_path: Path,
) -> None:
    """`mkdocs build --strict` passes with no warning; the site is the guide and the
    reference (not the developers' notes), loads nothing from the network, and its API
    reference has an entry for every name in `trioworker.__all__` and
    `trioworker.testing.__all__`."""
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output, output
    assert (site / "css" / "base.css").is_file(), "the theme's own files were left out"
    pages = {p.relative_to(site).as_posix(): p.read_text() for p in site.rglob("*.html")}
    assert not [p for p in pages if p.startswith(("adr/", "design/"))], "developer notes"
    fetched = [
        (name, url)
        for name, html in pages.items()
        for url in re.findall(r'<(?:script|link|img)\b[^>]*\b(?:src|href)="(https?://[^"]+)"', html)
    ]
    assert not fetched, f"the site loads from the network: {fetched}"
    reference = "".join(p.read_text() for p in (site / "reference").rglob("*.html"))
    for module in (trioworker, trioworker.testing):
        missing = [n for n in module.__all__ if f'id="{module.__name__}.{n}"' not in reference]
        assert not missing, f"the reference has no entry for {module.__name__}: {missing}"


def test_shown_output_is_compared_by_words_in_order() -> None:
    """A shown line matches a line of the output with the same words, however spaced
    and between whatever table rules; `...` stands for anything; order counts."""
    actual = "  kind    Queued \n ━━━━━━━━━ \n  Greet   ·   1  \nworker vm-42 ready\n"
    assert mismatch("kind Queued\nGreet · 1\nworker ... ready", actual) is None
    assert mismatch("...\nworker vm-...", actual) is None
    assert mismatch("Greet · 1\nkind Queued", actual) is not None
    assert mismatch("Greet 1", actual) is not None
    assert mismatch("4", actual) is not None  # not a word of `vm-42`


def test_the_guide_says_what_the_self_stop_does_not_end() -> None:
    """handlers.md says which things a handler starts are its own to end (threads,
    executors, system tasks, child processes), what the cancel does end, and what the
    fail-stop cannot (issue 35, item 11); its example runs with the rest of the page."""
    page = (GUIDE / "handlers.md").read_text()
    section = page.split("### What the self-stop ends, and what is the handler's own to end")[1]
    section = section.split("\n## ")[0]
    said = [
        "`threading.Thread`", "`concurrent.futures`", "`trio.lowlevel.spawn_system_task`",
        "`subprocess.Popen`", "`ctx.run_in_thread`", "exit status 70", "finally",
        "only what runs inside the\nattempt", "nor undoes what anything has already written",
    ]  # fmt: skip
    assert [s for s in said if s not in section] == []


def test_the_fastapi_guide_says_what_serves_the_application() -> None:
    """fastapi.md names an ASGI server and how to start the app under it, and says the
    Worker runs beside the server, not in it (issue 35, item 8). Prose: uvicorn is not
    a dependency, so its command is not run here."""
    page = (GUIDE / "fastapi.md").read_text()
    said = ["ASGI server", "`pip install uvicorn`", "`uvicorn myapp.web:app`",
            "The Worker runs as its own process beside it"]  # fmt: skip
    assert [s for s in said if s not in page] == []
