"""The chaos suite's own judgement: a check that cries wolf blocks landings too."""

from __future__ import annotations

import pytest

from tests.chaos.invariants import lagging_partitions

pytestmark = pytest.mark.unit


def test_a_partition_that_never_received_a_record_is_not_lagging() -> None:
    # CI once failed on "committed -1 of 0 (0 records behind)": 30 random
    # conversation ids had all missed partition 0.
    assert lagging_partitions({0: (-1, 0), 1: (12, 12)}) == {}


def test_records_behind_are_counted_from_the_committed_offset() -> None:
    assert lagging_partitions({0: (5, 9), 1: (-1, 3), 2: (7, 7)}) == {0: 4, 1: 3}
