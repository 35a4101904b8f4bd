"""A partition with no committed offset is read again from its start after a
rebalance, and Faust's read offset goes back with it: its fetch loop drops
every record below that offset, so without the reset the records read before
the rebalance were never delivered again (offsets 0 and 1 of a fresh group
were lost so in a broker-restart chaos run; that this was the cause is not
proven)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from faust.types import TP

from streams.kafka.consumer import Rebalance

pytestmark = pytest.mark.unit

FRESH = TP("t.messages", 3)
COMMITTED = TP("t.messages", 1)
OTHER = TP("t.accounting-control", 3)


@dataclass
class FakeConsumer:
    _read_offset: dict[TP, int | None] = field(default_factory=dict)
    seeks: list[dict[TP, int]] = field(default_factory=list)

    def assignment(self) -> set[TP]:
        return {FRESH, COMMITTED, OTHER}

    async def seek_to_committed(self) -> dict[TP, int | None]:
        return {FRESH: None, COMMITTED: 40, OTHER: None}

    async def earliest_offsets(self, *tps: TP) -> dict[TP, int]:
        return dict.fromkeys(tps, 0)

    async def seek_wait(self, offsets: dict[TP, int]) -> None:
        self.seeks.append(dict(offsets))


async def test_an_uncommitted_partition_is_read_again_from_its_start() -> None:
    consumer = FakeConsumer(_read_offset={FRESH: 1, COMMITTED: 45, OTHER: 7})
    scheduler: Any = object()
    rebalance = Rebalance(lambda: consumer, scheduler, {"t.messages"})
    await rebalance.rewind_uncommitted()
    assert consumer.seeks == [{FRESH: 0}]
    assert consumer._read_offset == {FRESH: None, COMMITTED: 45, OTHER: 7}
