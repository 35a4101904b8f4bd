"""Records lost between Faust's fetch loop and the agent are read again before
the agent handles anything after them, on a real broker with a real Faust app.

Why: a clean-clone CI run's worker was never handed the first 12 records of a
fresh partition though its fetch loop moved past them; the commit-time guard
read them again, but after the agent had stored later turns, and a compaction
archived a tool result whose call was stored after it (issue 29). Here the
first four records are lost once on their way from the fetch loop to the
agent's queue; with ``streams.kafka.offset_order`` the agent handles all ten in
offset order, without it it handles the head last.
"""

from __future__ import annotations

import asyncio
import uuid
from functools import partial
from typing import Any

import faust
import pytest
from faust.types import TP

from streams.kafka import gap_reread
from streams.kafka.offset_order import OffsetOrder
from streams.kafka.stream_take import ready_events
from streams.worker import batching
from tests.integration.test_fetch_buffer import create, send
from tests.integration.test_seek_to_committed import plain_app

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RECORDS = 10
LOST = range(0, 4)


def ordering_app(bootstrap: str, name: str, ordered: bool) -> tuple[faust.App, list[int]]:
    """An app whose agent takes groups as the messages agent does, notes each
    offset it handles and acks it; the head of a fresh partition is expected
    at 0, as the worker's rebalance rewind tells the patches."""
    app = plain_app(bootstrap, name, broker_commit_interval=0.2)
    handled: list[int] = []

    @app.agent(app.topic(name, value_type=bytes))
    async def agent(stream: Any) -> None:
        manual = stream.noack()
        queue = manual.channel.queue
        groups = batching.in_groups(manual, 100, ready=partial(ready_events, manual))
        if ordered:
            groups = OffsetOrder(lambda: app.consumer, queue).in_order(groups)
        async for group in groups:
            for event in group:
                handled.append(event.message.offset)
                await manual.ack(event)

    @app.on_rebalance_complete.connect  # type: ignore[untyped-decorator]
    async def heads(sender: Any, **kwargs: Any) -> None:
        gap_reread.expect_heads(app.consumer, {TP(name, 0): 0})

    return app, handled


def losing_once(on_message: Any, lost: list[int]) -> Any:
    """The conductor's callback, losing the records at ``LOST`` the first time."""

    async def deliver(message: Any) -> None:
        if message.offset in LOST and message.offset not in lost:
            lost.append(message.offset)
            return  # the fetch loop moves past it; the agent never sees it
        await on_message(message)

    return deliver


@pytest.mark.parametrize("ordered", [True, False], ids=["offset-order", "without"])
async def test_records_lost_before_the_agent_are_handled_before_those_after_them(
    kafka_bootstrap: str, ordered: bool
) -> None:
    assert gap_reread.reread_gaps()  # the worker's fetch-loop patch (its re-reads)
    name = f"order-{uuid.uuid4().hex[:8]}"
    await create(kafka_bootstrap, name)
    await send(kafka_bootstrap, name, RECORDS)
    app, handled = ordering_app(kafka_bootstrap, name, ordered)
    lost: list[int] = []
    app.topics.on_message = losing_once(app.topics.on_message, lost)  # type: ignore[method-assign]
    await app.start()
    try:
        async with asyncio.timeout(60):
            while set(handled) != set(range(RECORDS)):
                await app.consumer.commit()  # the commit-time head guard's moment
                await asyncio.sleep(0.05)
    finally:
        await app.stop()
    assert lost == list(LOST)
    if ordered:
        assert handled == list(range(RECORDS))
    else:
        assert handled[: RECORDS - len(LOST)] == list(range(len(LOST), RECORDS)), handled
