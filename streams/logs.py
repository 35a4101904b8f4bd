"""Log lines as text or as one JSON object per line (``[service].log_format``).

``configure`` gives the root logger its one stderr handler; with ``json`` every
record (the worker's, the CLI's, Faust's, aiokafka's) becomes one JSON object:

    {"time": "...", "level": "INFO", "logger": "compactor.accounting",
     "message": "compaction 9f… of c-42 requested (over_budget), budget 8000",
     "conversation_id": "c-42", "compaction_id": "9f…"}

``conversation_id``, ``compaction_id`` and ``partition`` come from the call's
``extra=`` where the main log calls give them, and otherwise from
``log_context``, which the scheduler sets around each compaction it runs (a
contextvar: an asyncio task sees its own), so any line logged during a
compaction, a library's included, carries them. The worker keeps Faust from
configuring logging again (``override_logging=False``), so the format survives
the worker's start.

The JSON formatter is shared with the HTTP audit log (``streams.http.audit``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import IO, Literal

from pythonjsonlogger.json import JsonFormatter

LogFormat = Literal["text", "json"]

CONTEXT_FIELDS = ("conversation_id", "compaction_id", "partition")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_context: ContextVar[dict[str, object] | None] = ContextVar("compactor_log_context", default=None)


@contextmanager
def log_context(**fields: object) -> Iterator[None]:
    """Add ``fields`` (those not None) to every record logged inside the block."""
    current = _context.get() or {}
    token = _context.set({**current, **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


class ContextFields(logging.Filter):
    """Copies the ``log_context`` fields onto a record (``extra=`` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_context.get() or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def json_formatter(*, message_key: str = "message", level: bool = True) -> logging.Formatter:
    """One JSON object per line: time, level, logger, message and the record's extra fields."""
    return JsonFormatter(
        "{asctime}{levelname}{name}{message}" if level else "{asctime}{name}{message}",
        style="{",
        rename_fields={
            "asctime": "time",
            "levelname": "level",
            "name": "logger",
            "message": message_key,
        },
    )


def configure(
    log_format: LogFormat, level: int | str = logging.INFO, stream: IO[str] | None = None
) -> logging.Handler:
    """Replace the root logger's handlers with one on stderr (unless ``stream``)
    in ``log_format``; the handler. Python's warnings are logged too."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(
        json_formatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    handler.addFilter(ContextFields())
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    logging.captureWarnings(True)
    return handler


def logs_json() -> bool:
    """Whether the process logs JSON now (``configure("json")`` ran): a line written
    outside logging must then be JSON too."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)
