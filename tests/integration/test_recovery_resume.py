"""The end of table recovery, on a real broker: records the seek brings back are
processed, not cleared from the stream queues.

Why: Faust ends recovery by resuming the stream partitions, awaiting the seek
to their committed offsets, and only then resuming its flow control, which
clears every stream queue. Records the fetch loop delivered in between were
cleared unprocessed and never read again: a traced rebalance chaos run lost
the last records delivered before "Worker ready" on two partitions, and the
first deliveries, cleared as well, held the partitions' commits for good.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from faust.tables.recovery import Recovery
from faust.transport.consumer import Consumer

from streams.kafka import faust_patches
from streams.kafka.seeking import seek_before_resuming_streams
from tests.integration.test_fetch_buffer import create
from tests.integration.test_seek_to_committed import last_record_seen, recording_app

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RECORDS = 5
#: Loop turns between the seek's end and the recovery task resuming the flow.
BUSY_AFTER_SEEK_SECONDS = 1.0
#: How long the agent takes over each record: the next ones wait in its queue.
AGENT_SECONDS = 1.5


async def _keyed_record(bootstrap: str, topic: str) -> None:
    await create(bootstrap, topic)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"value", key=b"key", partition=0)
    finally:
        await producer.stop()


def _without_the_patch(monkeypatch: pytest.MonkeyPatch) -> None:
    for owner, name in (
        (Recovery, "on_recovery_completed"),
        (Recovery, "_resume_streams"),
        (Consumer, "resume_partitions"),
        (Consumer, "resume_flow"),
    ):
        monkeypatch.setattr(owner, name, getattr(owner, name).__wrapped__)


@pytest.mark.parametrize("patched", [True, False], ids=["patched", "without-this-patch"])
async def test_records_sought_back_at_the_end_of_recovery_reach_the_agent(
    kafka_bootstrap: str, patched: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop is busy for a moment after the seek (as under load) and the agent
    is slow: without the patch, the fetch loop delivers the partition's
    records in that moment, the agent takes the first, flow control clears the
    rest from its queue, and offsets 1 to 4 never reach it (if this case fails,
    Faust fixed it and the patch can go). Patched, the partition is fetched
    only once the queues are cleared: every record reaches the agent, once."""
    faust_patches.apply()  # the worker's patches (a fetch every 100 ms among them)
    assert seek_before_resuming_streams()  # applying twice is a no-op
    if not patched:
        _without_the_patch(monkeypatch)
    perform_seek = Consumer.perform_seek

    async def seek_then_busy(self: Any) -> None:
        await perform_seek(self)
        await asyncio.sleep(BUSY_AFTER_SEEK_SECONDS)

    monkeypatch.setattr(Consumer, "perform_seek", seek_then_busy)
    name = f"resume-{uuid.uuid4().hex[:8]}"
    app, seen, arrived = await recording_app(
        kafka_bootstrap, name, RECORDS, busy_seconds=AGENT_SECONDS
    )
    # A changelog with something to restore, as the worker's: Faust starts fetching
    # (and resumes the flow) when recovery starts, not only once it is over.
    app.Table(f"{name}-table", default=bytes, key_type=bytes, value_type=bytes)
    await _keyed_record(kafka_bootstrap, f"{name}-{name}-table-changelog")
    await app.start()
    try:
        async with asyncio.timeout(60):
            await app.tables.recovery.completed.wait()
            await last_record_seen(kafka_bootstrap, name, RECORDS, seen, arrived)
    finally:
        await app.stop()
    if patched:
        assert seen == list(range(RECORDS + 1))
    else:
        assert RECORDS in seen and not {1, 2, 3, 4} & set(seen), seen
