"""Text that came from handlers and callers, made safe to store and to show. Pure
functions."""

from __future__ import annotations

import datetime as dt
import re
import shlex


def storable(text: str, limit: int | None = None) -> str:
    """`text` as PostgreSQL's text type takes it, nothing lost: a lone surrogate (from
    `os.fsdecode` of a name that is not UTF-8, say) becomes its `\\udcXX` escape and a
    NUL becomes `\\x00`. With `limit`, cut to that many characters, marked with "...".
    """
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    text = text.replace("\x00", "\\x00")
    if limit is not None and len(text) > limit:
        text = text[: max(limit - 3, 0)] + "..."
    return text


def ascii_only(text: str) -> str:
    """`text` in ASCII, every other character as its backslash escape (`\\xe9`)."""
    return text.encode("ascii", "backslashreplace").decode("ascii")


#: What a terminal or a page would act on or hide rather than show: the C0 controls, DEL
#: and the C1 controls (ESC and CSI start the escape sequences that move the cursor, set
#: the title (OSC) or make links), lone surrogates (no encoding takes them), the line
#: separators and bidirectional controls that break or reorder a line, and the
#: invisible format characters (soft hyphen, zero-width spaces and joiners, BOM).
_HIDDEN = "\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff"
_HIDDEN_IN_LINE = re.compile(f"[\x00-\x1f{_HIDDEN}]")
_HIDDEN_IN_BLOCK = re.compile(f"[\x00-\x08\x0b-\x1f{_HIDDEN}]")  # not \t, \n


def _escape(match: re.Match[str]) -> str:
    return match[0].encode("unicode_escape").decode("ascii")  # \x1b, \t, \u202e, \udce9


def visible(text: str, *, lines: bool = False) -> str:
    """`text` as a terminal should show it: literally, each character it would act on
    or hide written as its escape instead (ESC as `\\x1b`, a tab as `\\t`). With
    `lines` (a payload, an error, a traceback), newlines and tabs stay as they are."""
    pattern = _HIDDEN_IN_BLOCK if lines else _HIDDEN_IN_LINE
    return pattern.sub(_escape, text)


_SURROGATE = re.compile("[\ud800-\udfff]")


def not_unicode(text: str) -> str | None:
    """Why `text` is not valid Unicode (None if it is): its first lone surrogate, named
    as the byte it stands for when it came from bytes that are not UTF-8 (Python decodes
    a command line's or a file name's with surrogateescape: byte 0xff is U+DCFF)."""
    found = _SURROGATE.search(text)
    if found is None:
        return None
    code, at = ord(found[0]), found.start() + 1
    if 0xDC80 <= code <= 0xDCFF:  # noqa: PLR2004  (surrogateescape's range)
        return f"byte 0x{code - 0xDC00:02x} at character {at} is not UTF-8"
    return f"a lone surrogate U+{code:04X} at character {at} is not a character"


_ASCII_END = 0x80


def _shell_escape(match: re.Match[str]) -> str:
    code = ord(match[0])  # $'...' reads \xHH as a byte: a UTF-8 character needs \uHHHH
    return f"\\x{code:02x}" if code < _ASCII_END else f"\\u{code:04x}"


def shell_word(text: str) -> str:
    """`text` as one word of a command line a reader can copy into a POSIX shell
    (`shlex.quote`); text holding a character `visible` would escape is written in the
    `$'...'` form of bash and zsh instead, with escapes, so it is still the same word
    and nothing of it acts on the terminal it is printed to."""
    if visible(text) == text:
        return shlex.quote(text)
    body = text.replace("\\", "\\\\").replace("'", "\\'")
    return "$'" + _HIDDEN_IN_LINE.sub(_shell_escape, body) + "'"


def short_duration(span: dt.timedelta) -> str:
    """7d, 12h, 90m, 45s: the largest unit that divides it (seconds otherwise)."""
    seconds = span.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
