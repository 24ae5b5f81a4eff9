"""The supervisor's log lines, written by a thread of their own.

The supervisor must kill a Worker that is past its bound however its stderr fares, and
a pipe nobody reads (a stuck log shipper) blocks whoever writes to it. So once it
supervises, its records are queued and a daemon thread writes them: its event loop
never waits on a write. At its end it gives the thread a bounded time to catch up;
past that the process must exit without flushing (`os._exit`), since a normal exit
would flush stderr and block again.
"""

from __future__ import annotations

import logging
import queue
import threading


class _Enqueue(logging.Handler):
    def __init__(self, records: queue.SimpleQueue[logging.LogRecord | None]) -> None:
        super().__init__()
        self._records = records

    def emit(self, record: logging.LogRecord) -> None:
        self._records.put(record)


class LogThread:
    """Root's handlers, fed by a thread from a queue between `start` and `finish`."""

    def __init__(self) -> None:
        self._records: queue.SimpleQueue[logging.LogRecord | None] = queue.SimpleQueue()
        self._handlers: list[logging.Handler] = []
        self._thread = threading.Thread(
            target=self._write, name="trioworker-supervisor-log", daemon=True
        )

    def start(self) -> None:
        """From now on, log calls only queue their record."""
        root = logging.getLogger()
        self._handlers = list(root.handlers)
        root.handlers[:] = [_Enqueue(self._records)]
        self._thread.start()

    def finish(self, timeout: float) -> bool:
        """Give the thread up to `timeout` seconds to write what is queued; whether it
        did (then root has its handlers back). Not started: True."""
        if not self._thread.is_alive():
            return True
        self._records.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        logging.getLogger().handlers[:] = self._handlers
        return True

    def _write(self) -> None:
        while (record := self._records.get()) is not None:
            for handler in self._handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)
