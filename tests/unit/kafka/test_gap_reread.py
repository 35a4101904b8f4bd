"""When a gap is read again and when Faust may commit over it
(``streams.kafka.gap_reread``; the whole path on a real broker is
tests/integration/test_gap_reread.py)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP

from streams.kafka import gap_reread
from streams.kafka.gap_reread import _on_gap, _pending

pytestmark = pytest.mark.unit

TP0 = TP("messages", 0)


def consumer() -> Any:
    return SimpleNamespace(_read_offset=defaultdict(lambda: None))


def test_a_gap_of_records_is_held_until_read_again_past_its_end() -> None:
    c = consumer()
    assert not _on_gap(c, TP0, 94, 96)  # 94 and 95 never delivered: not recorded
    reread = _pending(c, TP0)
    assert reread is not None and (reread.start, reread.end) == (94, 96)
    c._read_offset[TP0] = 96  # the record after the gap, delivered before the seek
    assert _pending(c, TP0) is reread  # not sought yet: still pending
    reread.sought = True
    c._read_offset[TP0] = 94  # the seek moved it back
    assert _pending(c, TP0) is reread
    c._read_offset[TP0] = 96  # read again past the gap's end
    assert _pending(c, TP0) is None


def test_one_offset_is_a_transaction_marker_and_faust_commits_over_it() -> None:
    c = consumer()
    assert _on_gap(c, TP0, 50, 51)
    assert _pending(c, TP0) is None


def test_a_gap_seen_again_on_the_second_read_is_real() -> None:
    c = consumer()
    assert not _on_gap(c, TP0, 10, 20)
    reread = _pending(c, TP0)
    assert reread is not None
    reread.sought = True
    assert _on_gap(c, TP0, 11, 20)  # from the start again: no records there
    assert not _on_gap(c, TP0, 30, 40)  # a new gap past it widens the re-read
    assert (reread.start, reread.end, reread.sought) == (10, 40, False)


def test_a_reread_that_never_ends_gives_way_after_a_while(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    c = consumer()
    now = [1000.0]
    monkeypatch.setattr(gap_reread.time, "monotonic", lambda: now[0])
    assert not _on_gap(c, TP0, 10, 20)
    now[0] += gap_reread.GIVE_UP_SECONDS + 1
    with caplog.at_level("WARNING", logger="compactor.worker"):
        assert _pending(c, TP0) is None
    assert "offsets 10..19 of messages:0 were not delivered again" in caplog.text


def _fresh(acked: list[int], committed: int | None = None, in_flight: tuple[int, ...] = ()) -> Any:
    c = consumer()
    c._unacked_messages = [SimpleNamespace(tp=TP0, offset=o, acked=False) for o in in_flight]
    c._acked = defaultdict(list, {TP0: acked})
    c._committed_offset = defaultdict(lambda: None, {TP0: committed})
    gap_reread.expect_heads(c, {TP0: 0})
    return c


def test_a_never_committed_partition_whose_head_was_not_delivered_is_read_again_once() -> None:
    c = _fresh([8, 9, 10])
    assert gap_reread._head_missing(c, TP0)  # 0..7 never delivered: held
    reread = _pending(c, TP0)
    assert reread is not None and (reread.start, reread.end) == (0, 8)
    assert not gap_reread._head_missing(c, TP0)  # once: the re-read decides


def test_a_head_that_was_delivered_or_a_committed_partition_commits_as_usual() -> None:
    assert not gap_reread._head_missing(_fresh([0, 1, 2]), TP0)
    assert not gap_reread._head_missing(_fresh([8, 9], committed=8), TP0)
    assert not gap_reread._head_missing(_fresh([]), TP0)
    c = consumer()
    c._unacked_messages = []
    c._acked = defaultdict(list, {TP0: [5]})
    c._committed_offset = defaultdict(lambda: None)
    assert not gap_reread._head_missing(c, TP0)  # no head expected: Faust's way


def test_a_head_still_being_processed_is_not_read_again() -> None:
    """Commands finish out of order: record 0 still running while 1 and 2 are
    acked is not a missing head (the unacked-head guard holds the commit)."""
    c = _fresh([1, 2], in_flight=(0,))
    assert not gap_reread._head_missing(c, TP0)
    assert _pending(c, TP0) is None
    c._unacked_messages[0].acked = True  # done; its ack joins the list
    c._acked[TP0].insert(0, 0)
    assert not gap_reread._head_missing(c, TP0)


def _deliver(c: Any, offsets: list[int]) -> list[int]:
    """What the fetch loop is handed of ``offsets``, in order, as Faust's loop
    moves its read offset past each record handed over."""
    handed = []
    for offset in offsets:
        if not gap_reread._held_back(c, TP0, offset):
            handed.append(offset)
            c._read_offset[TP0] = offset
    return handed


def test_records_past_a_gap_are_not_handed_over_before_the_gap_is_read_again() -> None:
    c = consumer()
    assert _deliver(c, [0, 1, 2, 5, 6, 7]) == [0, 1, 2]  # 3..4 missing: 5 on are held
    reread = _pending(c, TP0)
    assert reread is not None and (reread.start, reread.end, reread.sought) == (3, 5, False)
    reread.sought = True  # the seek back, before the next batch
    c._read_offset[TP0] = 3
    assert _deliver(c, [3, 4, 5, 6, 7]) == [3, 4, 5, 6, 7]
    assert _pending(c, TP0) is None


def test_a_gap_still_there_on_the_second_read_and_a_single_offset_are_let_through() -> None:
    c = consumer()
    assert _deliver(c, [10, 12]) == [10, 12]  # one offset (11): a marker, Faust's way
    assert _deliver(c, [20, 21]) == []  # 13..19 missing
    reread = _pending(c, TP0)
    assert reread is not None
    reread.sought, c._read_offset[TP0] = True, 12
    assert _deliver(c, [20, 21]) == [20, 21]  # no records there: real, Faust records it


def test_a_fresh_partition_is_handed_its_head_first_once() -> None:
    c = consumer()
    gap_reread.expect_heads(c, {TP0: 0})
    assert _deliver(c, [12, 13]) == []  # 0..11 never delivered: read again first
    reread = _pending(c, TP0)
    assert reread is not None and (reread.start, reread.end) == (0, 12)
    reread.sought = True  # sought back to 0: the read offset is None again
    c._read_offset[TP0] = None
    assert _deliver(c, [12, 13]) == [12, 13]  # the head is markers: once is enough
    fresh = consumer()
    gap_reread.expect_heads(fresh, {TP0: 0})
    assert _deliver(fresh, [0, 1]) == [0, 1]


async def test_only_topics_with_acks_are_held_back_a_compacted_changelog_is_not() -> None:
    changelog, messages = TP("app-table-changelog", 0), TP0
    c = consumer()
    c.app = SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda t: t == "messages"))

    async def fetched() -> Any:
        for tp, offset in ((changelog, 0), (changelog, 9), (messages, 0), (messages, 9)):
            yield tp, SimpleNamespace(offset=offset)
            c._read_offset[tp] = offset  # Faust's loop moves past what it was handed

    handed = [(tp.topic, m.offset) async for tp, m in gap_reread.in_offset_order(c, fetched())]
    assert handed == [("app-table-changelog", 0), ("app-table-changelog", 9), ("messages", 0)]
    assert _pending(c, changelog) is None  # records compacted away: not read again
