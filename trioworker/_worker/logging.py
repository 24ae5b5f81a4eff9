"""Structured logs: every line about an item carries its id, attempt, kind, scope and
the Worker's id; `--log-format json` writes one JSON object per line; a filter masks
the DSN's password wherever it would appear. Text lines show what items carry
literally: control characters escaped (`_text.visible`), so none reaches a terminal.

A handler's traceback comes as text (the record's `traceback`, made by
`policy.describe_traceback`, bounded and never raising), not as `exc_info`: formatting
a handler's exception again here could raise whatever its `__str__` raises.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from collections.abc import Iterable, Mapping, MutableMapping
from types import TracebackType
from typing import Any

from trioworker._core.model import WorkItem
from trioworker._core.text import visible

ITEM_FIELDS = ("item_id", "attempt", "kind", "scope", "worker_id")


class ItemLogger(logging.LoggerAdapter[logging.Logger]):
    """Adds the item's fields to every record."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def item_logger(logger: logging.Logger, item: WorkItem, worker_id: str) -> ItemLogger:
    fields: Mapping[str, object] = {
        "item_id": item.id,
        "attempt": item.attempt,
        "kind": item.kind,
        "scope": item.scope,
        "worker_id": worker_id,
    }
    return ItemLogger(logger, fields)


def _context(record: logging.LogRecord) -> dict[str, Any]:
    return {f: getattr(record, f) for f in ITEM_FIELDS if hasattr(record, f)}


def handler_traceback(record: logging.LogRecord) -> str | None:
    """The handler's traceback a record carries (`extra={"traceback": ...}`), if any."""
    text = getattr(record, "traceback", None)
    return text if isinstance(text, str) and text else None


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        """The line, and under it the handler's traceback the record carries, if any."""
        line = super().format(record)
        text = handler_traceback(record)
        return line if text is None else line + "\n" + visible(text.rstrip("\n"), lines=True)

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The line with the item's fields after it, before any traceback; what they
        carry shown `visible` (a field on one line, the message keeping its lines)."""
        line = visible(super().formatMessage(record), lines=True)
        context = _context(record)
        if context:
            line += " [" + " ".join(f"{k}={visible(str(v))}" for k, v in context.items()) + "]"
        return line

    def formatException(
        self,
        ei: tuple[type[BaseException], BaseException, TracebackType | None]
        | tuple[None, None, None],
    ) -> str:
        """The traceback, its exception's text shown `visible` (lines kept)."""
        return visible(super().formatException(ei), lines=True)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_context(record),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif (text := handler_traceback(record)) is not None:
            entry["exception"] = text
        return json.dumps(entry, default=str)


class RedactingFilter(logging.Filter):
    """Masks secrets in the formatted message of every record it passes."""

    def __init__(self, *secrets: str | None) -> None:
        super().__init__()
        # The longest first, so no part of one is left beside a shorter one's mask.
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            message = original = record.getMessage()
            for secret in self.secrets:
                message = message.replace(secret, "***")
            if message != original:
                record.msg = message
                record.args = None
        return True


def configure(level: str = "INFO", fmt: str = "text", secrets: Iterable[str] = ()) -> None:
    """Send trioworker's logs (and the libraries') to stderr in the chosen format,
    masking `secrets` (the DSN's password, in every form it may take)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter(*secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
