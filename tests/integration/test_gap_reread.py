"""A gap of records is read again before Faust commits over it, on a real broker
with a real Faust app.

Why: Faust commits over offsets its fetch loop never delivered (a *gap*) as if
acked. Some are no records (transaction markers), but records fetched and then
dropped upstream look the same: the upgrade chaos test lost ``messages:0@95``
so (issue 29). Here a fetched batch loses four records on its way to the fetch
loop, as an upstream drop would; ``streams.kafka.gap_reread`` makes them reach
the agent, in offset order, and Faust as released never delivers them and
commits past them.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from faust.transport.consumer import Consumer
from faust.types import TP

from streams.kafka import gap_reread
from tests.integration.test_fetch_buffer import send
from tests.integration.test_seek_to_committed import recording_app

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RECORDS = 10
# Offsets 2..5: a gap of four records; 0..3: the head of a never-committed
# partition, which the fetch loop does not see as a gap (the rebalance's rewind
# tells the patch where it starts: ``expect_heads``).
WHERE = {"gap": range(2, 6), "head": range(0, 4)}


@pytest.mark.parametrize("where", list(WHERE))
@pytest.mark.parametrize("patched", [True, False], ids=["patched", "faust-as-released"])
async def test_records_dropped_before_the_fetch_loop_are_read_again(
    kafka_bootstrap: str, patched: bool, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dropped_offsets = WHERE[where]
    assert gap_reread.reread_gaps()
    assert gap_reread.reread_gaps()  # applying twice is a no-op
    if not patched:
        for name in ("_add_gap", "_new_offset", "getmany", "perform_seek"):
            released = getattr(Consumer, name).__wrapped__
            monkeypatch.setattr(Consumer, name, released)
    name = f"gap-{uuid.uuid4().hex[:8]}"
    app, seen, arrived = await recording_app(
        kafka_bootstrap, name, RECORDS, broker_commit_interval=0.2
    )
    await app.start()
    try:
        consumer = app.consumer
        if where == "head":
            gap_reread.expect_heads(consumer, {TP(name, 0): 0})
        wait_next_records = consumer._wait_next_records
        dropped: list[int] = []

        async def lose_four_records_once(timeout: float) -> Any:
            records, active = await wait_next_records(timeout)
            for tp, batch in (records or {}).items():
                if not dropped and any(r.offset in dropped_offsets for r in batch):
                    dropped.extend(r.offset for r in batch if r.offset in dropped_offsets)
                    records[tp] = [r for r in batch if r.offset not in dropped_offsets]
            return records, active

        consumer._wait_next_records = lose_four_records_once
        async with asyncio.timeout(60):
            while RECORDS - 1 not in seen:
                arrived.clear()
                await arrived.wait()
            await send(kafka_bootstrap, name, 1)  # offset 10: whatever comes before it came
            while RECORDS not in seen:
                arrived.clear()
                await arrived.wait()
            (tp,) = (tp for tp in consumer.assignment() if tp.topic == name)
            while (consumer._committed_offset.get(tp) or 0) < RECORDS + 1:
                await consumer.commit()  # everything delivered is acked: the commit catches up
                await asyncio.sleep(0.05)
    finally:
        await app.stop()
    assert dropped == list(dropped_offsets)
    if patched:
        assert sorted(set(seen)) == list(range(RECORDS + 1))
        # and in offset order: nothing past the gap before the gap itself (a
        # conversation's later turns stored and compacted before its first ones)
        assert seen == sorted(seen), seen
    else:
        assert not set(dropped_offsets) & set(seen), seen  # never delivered, and committed past
