"""The dead-letter policy: an unusable record is copied, untouched, with the reason.

The value keeps the original bytes so the record can be fixed and re-driven;
the reason, error type and source coordinates travel as ``dlq.*`` headers, after
the record's own headers (kept, so a re-driven record is the one that came).
A record too large for one producer request (the broker may accept larger
ones than our producer may send) is dead-lettered with its first bytes and
``dlq.truncated``: it must leave a trace, never vanish with a failed send.

With ``[kafka].dead_letter_content = "redacted"`` the value is dropped: the
dead letter keeps the reason, the error type, the source coordinates, the
original size and the key (the conversation id), and ``dlq.redacted`` says
so; re-drive from the source topic's offset while it is retained.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal

from core.ports.publisher import Publisher, RecordTooLarge
from streams.events import DeadLetterHeaders
from streams.metrics import Metrics
from streams.worker.records import InvalidRecord, Record

log = logging.getLogger("compactor.worker")

# Room left in a request for the key, the headers and the batch framing.
REQUEST_OVERHEAD_BYTES = 16 * 1024
# Keys are conversation ids; a longer one is garbage and is cut to this.
MAX_KEY_BYTES = 4096
# What is kept of a value the broker refused even truncated to the request size
# (its topic's max.message.bytes is smaller than our producer's limit).
LAST_RESORT_BYTES = 8 * 1024


class DeadLetters:
    def __init__(
        self,
        publisher: Publisher,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        *,
        max_request_bytes: int = 1_048_576,
        content: Literal["full", "redacted"] = "full",
    ) -> None:
        self._publisher = publisher
        self._metrics = metrics
        self._clock = clock
        self._max_value = max(LAST_RESORT_BYTES, max_request_bytes - REQUEST_OVERHEAD_BYTES)
        self._redacted = content == "redacted"

    async def send(self, record: Record, error: InvalidRecord) -> None:
        value = record.value or b""
        try:
            await self._send(record, error, self._max_value)
        except RecordTooLarge:
            if len(value) <= LAST_RESORT_BYTES:
                raise
            await self._send(record, error, LAST_RESORT_BYTES)
        self._metrics.dead_lettered.labels(record.topic, error.error_type).inc()
        log.warning(
            "dead-lettered %s[%d]@%d (%d bytes): %s",
            record.topic,
            record.partition,
            record.offset,
            len(value),
            error.reason,
        )

    async def _send(self, record: Record, error: InvalidRecord, max_value: int) -> None:
        value, key = record.value, record.key
        size = len(value or b"")
        if self._redacted:
            value = None
        truncated = (value is not None and len(value) > max_value) or (
            key is not None and len(key) > MAX_KEY_BYTES
        )
        headers = DeadLetterHeaders.model_validate(
            {
                "dlq.reason": error.reason,
                "dlq.error_type": error.error_type,
                "dlq.source_topic": record.topic,
                "dlq.source_partition": record.partition,
                "dlq.source_offset": record.offset,
                "dlq.failed_at": datetime.fromtimestamp(self._clock(), UTC),
                "dlq.original_size": size,
                "dlq.truncated": truncated,
                "dlq.redacted": self._redacted,
            }
        )
        # The record's own headers (a tenant's signature, a producer's trace id) travel
        # with it, so `compactor dead-letters redrive` re-publishes it as it came.
        kept = [(name, raw) for name, raw in record.headers if not name.startswith("dlq.")]
        await self._publisher.publish(
            "dead_letters",
            None if key is None else key[:MAX_KEY_BYTES],
            None if value is None else value[:max_value],
            [*kept, *headers.to_kafka()],
        )
