"""The binary search behind ``KafkaCommandBacklog``: the same answer as asking
the broker about every issue time, in a logarithmic number of rounds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.kafka.command_backlog import _Search

pytestmark = pytest.mark.unit


@st.composite
def partitions(draw: st.DrawFn) -> tuple[list[int], list[int], int]:
    """Record timestamps of a partition (offset = index; not always increasing,
    as several producers stamp their own), issue times, a committed offset."""
    stamps = draw(st.lists(st.integers(0, 60), max_size=40))
    times = sorted(set(draw(st.lists(st.integers(0, 70), min_size=1, max_size=40))))
    committed = draw(st.integers(-1, len(stamps) + 1))
    return stamps, times, committed


def first_at_or_after(stamps: list[int], at: int) -> int | None:
    """What the broker's ListOffsets by time answers."""
    return next((offset for offset, stamp in enumerate(stamps) if stamp >= at), None)


@given(partitions())
def test_the_search_agrees_with_a_lookup_per_time(case: tuple[list[int], list[int], int]) -> None:
    stamps, times, committed = case
    search = _Search(times, committed)
    rounds = 0
    while True:
        asks = [
            a for a in (search.next_consumed_probe(), search.next_missing_probe()) if a is not None
        ]
        if not asks:
            break
        rounds += 1
        for at in asks:
            search.learn(at, first_at_or_after(stamps, at))
    assert rounds <= math.ceil(math.log2(len(times) + 1)) + 1
    for at in times:
        first = first_at_or_after(stamps, at)
        assert search.queued(at) == (first is not None and first >= committed), at
