"""The dead-letter policy: an unusable record is copied, untouched, with the reason.

The value keeps the original bytes so the record can be fixed and re-driven;
the reason, error type and source coordinates travel as ``dlq.*`` headers, after
the record's own headers (kept, so a re-driven record is the one that came).
The worker's producer may send any record its source topics accept, with
room for the headers (``streams/kafka/admin.py`` raises
``[kafka].max_request_bytes`` to that, and creates the dead-letter topic to
accept it), so a dead letter is whole. Only when the broker still refuses it
(a dead-letter topic created smaller, say) is it sent again with its first
bytes, and ``dlq.truncated``: it must leave a trace, never vanish with a
failed send. First cut to what any topic with the broker's default limit
takes (``FALLBACK_REQUEST_BYTES``), then to ``LAST_RESORT_BYTES``.

With ``[kafka].dead_letter_content = "redacted"`` the value is dropped: the
dead letter keeps the reason, the error type, the source coordinates, the
original size and the key (the conversation id), and ``dlq.redacted`` says
so; re-drive from the source topic's offset while it is retained.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Literal

from core.ports.publisher import Publisher, RecordTooLarge
from streams.dead_letter_headers import DeadLetterHeaders
from streams.metrics import Metrics
from streams.worker.records import InvalidRecord, Record

log = logging.getLogger("compactor.worker")

# What sends one record's dead letter (``DeadLetters.send``, or a caller's wrapper of it).
SendDeadLetter = Callable[[Record, InvalidRecord], Awaitable[None]]

# Room left in a request for the key, the headers and the batch framing.
REQUEST_OVERHEAD_BYTES = 16 * 1024
# Keys are conversation ids; a longer one is garbage and is cut to this.
MAX_KEY_BYTES = 4096
# The first cut of a value the broker refused whole: what a topic with Kafka's
# default limit (message.max.bytes, 1 MiB and a few bytes) accepts.
FALLBACK_REQUEST_BYTES = 1_048_576
# What is kept of a value the broker refused even so.
LAST_RESORT_BYTES = 8 * 1024


class DeadLetters:
    def __init__(
        self,
        publisher: Publisher,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        *,
        max_request_bytes: int = 1_048_576,
        content: Literal["full", "redacted"] = "redacted",
    ) -> None:
        self._publisher = publisher
        self._metrics = metrics
        self._clock = clock
        self._max_value = max(LAST_RESORT_BYTES, max_request_bytes - REQUEST_OVERHEAD_BYTES)
        self._redacted = content == "redacted"

    def _cuts(self, size: int) -> list[int]:
        """The value sizes to try, largest first: whole (up to the request limit),
        then each smaller cut shorter than the record."""
        first = min(size, self._max_value)
        smaller = (FALLBACK_REQUEST_BYTES - REQUEST_OVERHEAD_BYTES, LAST_RESORT_BYTES)
        return [first, *(cut for cut in smaller if cut < first)]

    async def send(self, record: Record, error: InvalidRecord) -> None:
        value = record.value or b""
        cuts = self._cuts(len(value))
        for attempt, cut in enumerate(cuts):
            try:
                await self._send(record, error, cut)
                break
            except RecordTooLarge:
                if attempt == len(cuts) - 1:
                    raise
                log.warning(
                    "the broker refused the dead letter of %s[%d]@%d with %d bytes of its "
                    "value; sending the first %d",
                    record.topic,
                    record.partition,
                    record.offset,
                    cut,
                    cuts[attempt + 1],
                )
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
