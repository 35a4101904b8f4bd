"""The clip-archive fit's search (``core.domain.compaction.longest_fitting_prefix``).

Why: the fit shows the longest prefix of a re-summary that keeps the history
under its target; one off by one either way is a history over budget for
ever, or a summary cut shorter than it had to be.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.domain.compaction import longest_fitting_prefix

pytestmark = pytest.mark.unit


@given(length=st.integers(0, 5_000), limit=st.integers(0, 6_000))
def test_it_finds_exactly_the_largest_prefix_that_fits(length: int, limit: int) -> None:
    asked: list[int] = []

    def fits(n: int) -> bool:
        asked.append(n)
        return n <= limit

    assert longest_fitting_prefix(length, fits) == min(length, limit)
    assert all(0 < n <= length for n in asked)
    assert len(asked) <= length.bit_length() + 1  # a binary search, not a scan
