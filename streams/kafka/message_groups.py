"""The messages agent's loop: Faust's stream in groups, each accounted durably.

A group is what is waiting (``streams.worker.batching``, taken at once by
``streams.kafka.stream_take``), each partition's events in offset order
(``streams.kafka.offset_order``), decoded while the group before it is stored
(``streams.worker.overlap``), and acked once the table entries it changed are
flushed (``streams.worker.tally_table.AcksAfterFlush``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from streams.kafka.offset_order import OffsetOrder
from streams.kafka.stream_take import ready_events
from streams.worker import batching
from streams.worker.accounting import Accounting
from streams.worker.acks_after_flush import AcksAfterFlush
from streams.worker.ingest import Decoded
from streams.worker.overlap import overlapped
from streams.worker.records import record_of


async def account_message_groups(
    manual: Any,
    accounting: Accounting,
    acks: AcksAfterFlush,
    *,
    limit: int,
    seen: Callable[[Any], None],
) -> None:
    """``manual``: the agent's stream, in ``noack`` mode (acks are ``acks``')."""
    queue = getattr(manual.channel, "queue", None)

    async def decode(group: list[Any]) -> Decoded:
        return await accounting.decode([record_of(event) for event in group])

    async def account(group: list[Any], ahead: Decoded) -> None:
        revoked = await accounting.handle_batch(ahead.records, ahead)
        acks.hold(manual, group, skip=revoked)
        await acks.settle()

    groups = batching.in_groups(manual, limit, seen, partial(ready_events, manual))
    ordered = OffsetOrder(lambda: manual.app.consumer, queue).in_order(groups)
    await overlapped(ordered, decode, account, lambda: queue is not None and not queue.empty())
