"""The messages agent is handed each partition's events in offset order
(``streams.kafka.offset_order``; on a real broker: tests/integration/test_offset_order.py)."""

from __future__ import annotations

from collections import defaultdict, deque
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP

from streams.kafka import gap_reread
from streams.kafka.offset_order import OffsetOrder

pytestmark = pytest.mark.unit

TP0, TP1 = TP("messages", 0), TP("messages", 1)


def consumer(committed: dict[Any, int] | None = None) -> Any:
    return SimpleNamespace(
        _read_offset=defaultdict(lambda: None),
        _committed_offset=defaultdict(lambda: None, committed or {}),
    )


def events(*offsets: int, tp: Any = TP0, generation: int = 1) -> list[Any]:
    return [
        SimpleNamespace(message=SimpleNamespace(tp=tp, offset=o, generation_id=generation))
        for o in offsets
    ]


def offsets(admitted: list[Any]) -> list[int]:
    return [event.message.offset for event in admitted]


def seek_back(c: Any, tp: Any = TP0) -> None:
    """What the fetch loop does before its next batch: seek to the re-read's start."""
    pending = gap_reread._pending(c, tp)
    assert pending is not None and not pending.sought
    pending.sought = True
    c._read_offset[tp] = pending.start or None


def test_a_fresh_partition_whose_head_never_arrived_is_read_again_before_the_rest() -> None:
    c = consumer()
    gap_reread.expect_heads(c, {TP0: 0})
    queued = events(14, 15)
    order = OffsetOrder(lambda: c, SimpleNamespace(_queue=deque(queued)))
    assert order.admit(events(12, 13)) == []  # 0..11 never reached the agent
    pending = gap_reread._pending(c, TP0)
    assert pending is not None and (pending.start, pending.end) == (0, 12)
    assert order.admit(queued) == []  # waiting when the hole was found
    assert order.admit(events(16)) == []  # on its way: the re-read is still to come
    seek_back(c)
    again = events(*range(0, 17))
    assert offsets(order.admit(again)) == list(range(0, 17))


def test_a_partition_starts_at_its_committed_offset_and_a_marker_is_not_a_hole() -> None:
    c = consumer({TP0: 40, TP1: 7})
    order = OffsetOrder(lambda: c, None)
    assert offsets(order.admit(events(41, 42) + events(7, 8, tp=TP1))) == [41, 42, 7, 8]
    assert offsets(order.admit(events(44))) == [44]  # 43: one offset, a marker
    assert offsets(order.admit(events(40, 41))) == [40, 41]  # read again: duplicates pass
    assert gap_reread._pending(c, TP0) is None


def test_a_hole_inside_a_partition_sets_aside_only_that_partition() -> None:
    c = consumer({TP0: 0, TP1: 0})
    order = OffsetOrder(lambda: c, None)
    assert offsets(order.admit(events(0, 1, 2))) == [0, 1, 2]
    mixed = events(6, 7) + events(0, 1, tp=TP1)
    assert offsets(order.admit(mixed)) == [0, 1]  # 3..5 of TP0 missing
    seek_back(c)
    assert offsets(order.admit(events(3, 4, 5, 6, 7))) == [3, 4, 5, 6, 7]


def test_a_hole_with_no_records_is_admitted_once_read_again() -> None:
    c = consumer({TP0: 10})
    order = OffsetOrder(lambda: c, None)
    assert order.admit(events(20)) == []
    seek_back(c)
    c._read_offset[TP0] = 20  # the second read found nothing before 20
    assert offsets(order.admit(events(20, 21))) == [20, 21]


def test_a_new_generation_starts_over_from_its_committed_offset() -> None:
    c = consumer({TP0: 5})
    order = OffsetOrder(lambda: c, None)
    assert offsets(order.admit(events(5, 6))) == [5, 6]
    c._committed_offset[TP0] = 100  # another worker moved it on meanwhile
    assert offsets(order.admit(events(100, generation=2))) == [100]
    assert offsets(order.admit(events(7))) == [7]  # a stale event of generation 1
    assert order.admit(events(103, generation=2)) == []  # 101..102 missing
