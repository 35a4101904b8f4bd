"""The dead-letter policy: an unusable record is copied, untouched, with the reason.

The value keeps the original bytes so the record can be fixed and re-driven;
the reason, error type and source coordinates travel as ``dlq.*`` headers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from streams.events import DeadLetterHeaders
from streams.metrics import Metrics
from streams.worker.publisher import Publisher
from streams.worker.records import InvalidRecord, Record

log = logging.getLogger("compactor.worker")


class DeadLetters:
    def __init__(
        self, publisher: Publisher, metrics: Metrics, clock: Callable[[], float] = time.time
    ) -> None:
        self._publisher = publisher
        self._metrics = metrics
        self._clock = clock

    async def send(self, record: Record, error: InvalidRecord) -> None:
        headers = DeadLetterHeaders.model_validate(
            {
                "dlq.reason": error.reason,
                "dlq.error_type": error.error_type,
                "dlq.source_topic": record.topic,
                "dlq.source_partition": record.partition,
                "dlq.source_offset": record.offset,
                "dlq.failed_at": datetime.fromtimestamp(self._clock(), UTC),
            }
        )
        await self._publisher.publish("dead_letters", record.key, record.value, headers.to_kafka())
        self._metrics.dead_lettered.labels(record.topic, error.error_type).inc()
        log.warning(
            "dead-lettered %s[%d]@%d: %s",
            record.topic,
            record.partition,
            record.offset,
            error.reason,
        )
