"""The guide's code blocks, read from Markdown, and the loose match of shown output.

Pure functions: `tests/acceptance/test_docs.py` runs what these return. The rules a page
follows (which block is a file, a command, a script, SQL or output) are in that
module's docstring.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import attrs

#: `<!-- docs-test: KEY VALUE -->`: a page's settings for its run.
_DIRECTIVE = re.compile(r"^<!--\s*docs-test:\s*(?P<key>[\w-]+)\s*(?P<value>.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>.*)$")
#: The first line of a block that is a file: `# file: PATH` (or `-- file: PATH` in SQL);
#: or an excerpt of one: `# from: PATH`.
_FILE = re.compile(r"^(?:#|--)\s*file:\s*(?P<path>\S+)\s*$")
_EXCERPT = re.compile(r"^#\s*from:\s*(?P<path>\S+)\s*$")
#: A command's trailing comment that says how it ends.
_EXITS = re.compile(r"#\s*exits\s+(?P<code>\d+)\s*$")
_BACKGROUND = re.compile(r"#\s*leave it running\s*$")
#: Tokens that only draw a table (rich's rules, psql's separators) carry no content.
_RULE = re.compile(r"^[-+|=:━─│┃═╇╈┡┩┼╋]+$")
#: An install command quoted in prose: `pip install ...` as one inline code span.
_INLINE_PIP = re.compile(r"(?<!`)`(?P<command>pip install [^`\n]+)`(?!`)")


@attrs.frozen
class Block:
    """One fenced code block of a page."""

    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    text: str

    @property
    def file(self) -> str | None:
        """The path this block is the content of, if its first line names one."""
        first = self.text.split("\n", 1)[0]
        match = _FILE.match(first)
        return match["path"] if match else None

    @property
    def excerpt_of(self) -> str | None:
        """The file this block shows part of, if its first line names one."""
        first = self.text.split("\n", 1)[0]
        match = _EXCERPT.match(first)
        return match["path"] if match else None

    @property
    def body(self) -> str:
        """The block without its first line."""
        return self.text.split("\n", 1)[1] if "\n" in self.text else ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


@attrs.frozen
class Command:
    """One line of a ```sh block."""

    line: str  # as written, without the trailing marker comment
    exits: int = 0
    background: bool = False


@attrs.frozen
class Page:
    name: str
    blocks: tuple[Block, ...]
    settings: dict[str, str]


def read_page(path: Path) -> Page:
    """The fenced blocks and `docs-test` settings of a Markdown page."""
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    settings: dict[str, str] = {}
    i = 0
    while i < len(lines):
        directive = _DIRECTIVE.match(lines[i])
        if directive:
            settings[directive["key"]] = directive["value"]
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        if fence["indent"]:
            raise ValueError(f"{path.name}:{i + 1}: indented code fences are not run; unindent")
        closing = fence["fence"]
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].rstrip() != closing:
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{path.name}:{start + 1}: code fence never closed")
        lang = fence["info"].split()[0] if fence["info"].strip() else ""
        blocks.append(Block(path.name, start + 1, lang, "\n".join(body) + "\n"))
        i += 1
    return Page(path.name, tuple(blocks), settings)


def commands(block: Block) -> list[Command]:
    """The commands of a ```sh block: one a line (a trailing backslash continues it),
    blank lines and whole-line comments skipped."""
    result: list[Command] = []
    pending = ""
    for raw in block.text.split("\n"):
        line = pending + raw
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        exits = _EXITS.search(stripped)
        background = _BACKGROUND.search(stripped)
        if exits:
            stripped = stripped[: exits.start()].rstrip()
        if background:
            stripped = stripped[: background.start()].rstrip()
        result.append(
            Command(stripped, exits=int(exits["code"]) if exits else 0, background=bool(background))
        )
    return result


def pip_install(line: str) -> list[tuple[str, list[str]]] | None:
    """The (name, extras) of each package `pip install ...` (or `pip wheel ...`) names
    (None: not such a line). `.` and `.[EXTRAS]` are the checkout, a `.whl` path the
    wheel built from it: both are trioworker (tests/acceptance/test_wheel.py installs
    them for real)."""
    words = shlex.split(line, comments=True)
    if words[:2] not in (["pip", "install"], ["pip", "wheel"]):
        return None
    packages = []
    for requirement in (w for w in words[2:] if not w.startswith("-")):
        wheel = re.fullmatch(r"\S+\.whl(?:\[(?P<extras>[\w,-]+)\])?", requirement)
        if words[1] == "wheel" or wheel:
            extras = wheel["extras"].split(",") if wheel and wheel["extras"] else []
            packages.append(("trioworker", extras))
            continue
        match = re.fullmatch(r"(?P<name>[\w.-]+)(?:\[(?P<extras>[\w,-]+)\])?", requirement)
        if match is None:
            raise ValueError(f"cannot check the requirement {requirement!r}")
        extras = match["extras"].split(",") if match["extras"] else []
        name = "trioworker" if match["name"] == "." else match["name"]
        packages.append((name, extras))
    return packages


def install_commands(path: Path) -> list[tuple[str, str]]:
    """Every `pip install ...` a Markdown file tells its reader to run, as (where,
    command): each such line of its ```sh blocks, and each inline code span that is one."""
    found = [
        (block.where, shlex.join(shlex.split(command.line, comments=True)))
        for block in read_page(path).blocks
        if block.lang == "sh"
        for command in commands(block)
        if command.line.startswith("pip install ")
    ]
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        found += [(f"{path.name}:{number}", m["command"]) for m in _INLINE_PIP.finditer(line)]
    return found


def _normalise(line: str) -> str:
    return " ".join(t for t in line.split() if not _RULE.match(t))


def _pattern(line: str) -> re.Pattern[str]:
    """A shown line as a pattern: its words in order, `...` standing for anything."""
    tokens = line.split()
    while tokens and tokens[0] == "...":  # the search is not anchored anyway
        tokens.pop(0)
    regex = ""
    for i, token in enumerate(tokens):
        if token == "...":
            regex += r"(?:\s+.*?)?"
            continue
        if i > 0:
            regex += r"\s+"
        regex += re.escape(token).replace(r"\.\.\.", ".*?")
    return re.compile(rf"(?<!\S){regex}(?!\S)")  # whole words: `1` is not in `10`


def mismatch(shown: str, actual: str) -> str | None:
    """Why `actual` does not show what `shown` says (None: it does).

    Each line shown must be found, in order, in a line of `actual`, comparing whole
    words and not spacing (a table's rules are ignored); `...` stands for anything,
    and a line of only `...` for lines left out.
    """
    lines = [_normalise(line) for line in actual.split("\n")]
    at = 0
    for wanted in shown.split("\n"):
        norm = _normalise(wanted)
        if not norm or norm == "...":
            continue
        pattern = _pattern(norm)
        while at < len(lines) and not pattern.search(lines[at]):
            at += 1
        if at == len(lines):
            return f"no line (at or after the ones matched before) shows {wanted.strip()!r}"
        at += 1
    return None
