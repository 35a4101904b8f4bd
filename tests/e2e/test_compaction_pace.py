"""A real worker paces its compactions by how late its messages are stored
(``core.domain.pace``, wired by ``streams.worker.assembly``).

Why end to end: the delay is the record's Kafka timestamp, which only the
Faust glue (``streams.worker.records.record_of``) hands over; unit tests build
their records themselves. Fresh records set the baseline, then one published
ten seconds earlier (CreateTime in the past, as from a producer that fell
behind) is late: the worker counts it and keeps its limit at the floor.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.conftest import Conversation, Stack, eventually
from tests.support.metrics_text import metric

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


async def test_a_message_stored_late_is_counted_and_the_limit_starts_at_the_floor(
    stack: Stack,
) -> None:
    worker = stack.worker(
        "w1", config={"service": {"min_concurrent_compactions": 2, "turn_delay_target_ms": 100}}
    )
    assert await worker.wait_ready(stack.names.messages) == {0, 1, 2, 3}
    assert metric(await worker.metrics_text(), "compactor_compaction_limit") == 2
    conv = Conversation("conv-pace", "pace")
    await stack.send_all([conv.message(), conv.message()])

    async def stored(count: int) -> None:
        text = await worker.metrics_text()
        assert metric(text, "compactor_events_in_total", outcome="new") >= count

    await eventually(lambda: stored(2), timeout=60, what="the fresh messages stored")
    text = await worker.metrics_text()
    assert metric(text, "compactor_turns_late_total") == 0
    late = conv.message()
    await stack.producer.send(
        stack.names.messages,
        json.dumps(late).encode(),
        key=conv.id.encode(),
        timestamp_ms=int((time.time() - 10) * 1000),
    )

    async def counted() -> None:
        text = await worker.metrics_text()
        assert metric(text, "compactor_turns_late_total") >= 1
        assert metric(text, "compactor_compaction_limit") == 2

    await eventually(counted, timeout=60, what="the late message counted")
