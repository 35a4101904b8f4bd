"""A group's messages never wait behind another conversation's compaction: the
part no compaction holds is stored, and its readers told, first
(``Ingest._save``, ``IngestStore.save_free``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.metrics_text import sample
from tests.unit.worker.harness import harness
from tests.unit.worker.test_batched_accounting import message_record

pytestmark = pytest.mark.unit


async def test_readers_are_told_before_the_part_a_compaction_holds_is_stored() -> None:
    h = harness()
    h.store.held.add("busy")  # a compaction of "busy" is being written
    notices, save_held = h.components.notices, h.store.ingest.save_messages
    told_first: list[tuple[int | None, int | None]] = []

    async def after_the_free_part(batch: Any) -> Any:
        told_first.append((notices.mark("free"), notices.mark("busy")))
        h.store.held.clear()  # the compaction committed: the wait is over
        return await save_held(batch)

    h.store.ingest.save_messages = after_the_free_part  # type: ignore[method-assign]
    group = [message_record(h, n, ("busy", "free")[n % 2], 10) for n in range(4)]
    await h.components.accounting.handle_batch(group)
    (told,) = told_first
    assert told[0] is not None and told[1] is None  # "free" told; "busy" not yet stored
    assert sorted(h.store.message_ids("busy")) == ["busy-m0000", "busy-m0002"]
    assert sorted(h.store.message_ids("free")) == ["free-m0001", "free-m0003"]
    assert (h.tally("busy").token_total, h.tally("free").token_total) == (20, 20)
    assert sample(h.components.metrics, "compactor_ingest_left_total") == 2
    assert notices.mark("busy") is not None  # and told once stored


async def test_a_group_no_compaction_holds_is_one_call() -> None:
    h = harness()
    calls: list[str] = []
    save_held = h.store.ingest.save_messages

    async def never(batch: Any) -> Any:
        calls.append("save_messages")
        return await save_held(batch)

    h.store.ingest.save_messages = never  # type: ignore[method-assign]
    await h.components.accounting.handle_batch([message_record(h, n, "c", 10) for n in range(3)])
    assert calls == [] and len(h.store.message_ids("c")) == 3
    assert sample(h.components.metrics, "compactor_ingest_left_total") == 0
