"""The reconciler: the timer asks for due conversations and compares with the store."""

from __future__ import annotations

import pytest

from core.domain.accounting import ConversationTally
from streams.events import ReconcileRequest
from tests.unit.worker.harness import harness

pytestmark = pytest.mark.unit


async def test_the_reconcile_timer_asks_only_for_due_conversations() -> None:
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 400)
    await h.message(0, "small", conversation="c2")
    assert await h.components.reconciler.tick() == 0  # c1's command is fresh, c2 is fine
    h.clock.now += 61
    assert await h.components.reconciler.tick() == 1
    (request,) = [p for p in h.publisher.on("control")]
    assert request.key == b"c1"
    assert ReconcileRequest.model_validate_json(request.value or b"").conversation_id == "c1"
    assert await h.components.reconciler.tick() == 0  # asked within the interval already


async def test_reconciliation_repairs_an_entry_the_store_has_over_budget() -> None:
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 400)  # 300 tokens: over budget, a command goes out
    h.components.table.put(
        ConversationTally(conversation_id="c1", token_total=10, message_count=3)
    )  # drifted low, nothing outstanding: the table alone would never act again
    assert await h.components.reconciler.tick() == 1  # the first pass asks the store
    (request,) = [p for p in h.publisher.on("control")]
    await h.control(ReconcileRequest.model_validate_json(request.value or b""))
    assert h.tally().token_total == 300
    assert len(h.commands()) == 2  # asked again, with the store's counts


async def test_reconciliation_leaves_other_workers_conversations_alone() -> None:
    h = harness()
    for i in range(3):
        await h.message(i, "x" * 400)
    h.table.clear()  # not in this worker's table ...
    h.components.reconciler._owns = lambda _: False  # ... and not its partition
    assert await h.components.reconciler.tick() == 0
