"""Disjoint spans of a text, claimed one by one (``core.domain.specifics``)."""

from __future__ import annotations

from bisect import bisect_right


class ClaimedSpans:
    """The disjoint spans claimed so far, sorted: whether a new one overlaps any is
    a look at its two neighbours (a scan of them all made a log's ten thousand
    mentions cost a hundred million comparisons)."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def overlaps(self, start: int, end: int) -> bool:
        at = bisect_right(self._starts, start)
        before = at > 0 and self._ends[at - 1] > start
        after = at < len(self._starts) and self._starts[at] < end
        return before or after

    def add(self, start: int, end: int) -> None:
        at = bisect_right(self._starts, start)
        self._starts.insert(at, start)
        self._ends.insert(at, end)
