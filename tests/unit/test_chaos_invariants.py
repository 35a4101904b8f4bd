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


async def test_a_message_below_a_committed_offset_missing_from_the_store_is_flagged_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``offsets_ahead``: Kafka's committed offset is the next to read, so only
    messages below it must be stored; one found stored is not asked for again."""
    from tests.chaos import invariants
    from tests.chaos.invariants import OffsetWatch, ProducedMessage

    committed = {0: 3, 1: -1}
    stored = {"m0", "m1"}
    asked: list[set[str]] = []

    async def committed_offsets(*_: object) -> dict[int, int]:
        return dict(committed)

    async def not_stored(_db: object, messages: list[ProducedMessage]) -> list[ProducedMessage]:
        asked.append({m.message_id for m in messages})
        return [m for m in messages if m.message_id not in stored]

    monkeypatch.setattr(invariants, "committed_offsets", committed_offsets)
    monkeypatch.setattr(invariants, "_not_stored", not_stored)
    produced = {f"m{i}": ProducedMessage(f"m{i}", "c", partition=0, offset=i) for i in range(4)} | {
        "n0": ProducedMessage("n0", "d", partition=1, offset=0)
    }
    watch = OffsetWatch("bootstrap", "group", "topic", 2)
    await watch.sample(object(), produced)  # type: ignore[arg-type]
    assert asked == [{"m0", "m1", "m2"}]  # m3 is the next to read, n0's partition has none
    assert len(watch.violations) == 1 and watch.violations[0].startswith("m2 (c) at topic:0@2")
    await watch.sample(object(), produced)  # type: ignore[arg-type]
    assert asked[-1] == {"m2"} and len(watch.violations) == 1  # flagged once


async def test_a_sample_that_cannot_run_is_skipped_not_a_violation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.chaos import invariants
    from tests.chaos.invariants import OffsetWatch

    async def broker_away(*_: object) -> dict[int, int]:
        raise ConnectionError("broker away")

    monkeypatch.setattr(invariants, "committed_offsets", broker_away)
    watch = OffsetWatch("bootstrap", "group", "topic", 1)
    await watch.sample(object(), {})  # type: ignore[arg-type]
    assert (watch.samples, watch.skipped, watch.violations) == (0, 1, [])
