"""Redo and undo (issue 18, part 2): recompact and restore through the control topic,
as the worker's components do them (accounting → command → processor), against
the in-memory ports."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from core.adapters.llm.extractive import ExtractiveProvider
from core.compaction.factory import create_compactor
from core.domain.tally import request_compaction_id
from core.domain.tokens import estimate_history_tokens
from streams.events import ClipArchiveEvent, CompactionCommand, RecompactRequest, RestoreRequest
from streams.worker.processor import Noop
from streams.worker.runtime import StaticRuntime
from tests.support.metrics_text import sample
from tests.unit.worker.harness import (
    BUDGET_TOKENS,
    NAMES,
    Harness,
    harness,
    over_budget,
    settings,
)

pytestmark = pytest.mark.unit

TARGET = int(0.8 * BUDGET_TOKENS)


def budgeted(
    h: Harness | None = None, model_max_tokens: int = 400, max_summary_tokens: int = 1024
) -> Harness:
    """The component harness with a compactor that meets the budget's target
    (``model_max_tokens`` × 0.5)."""
    h = h or harness()
    config = settings()
    budget = config.budget.model_copy(update={"model_max_tokens": model_max_tokens})
    # No specifics ledger: at this tiny budget its sections alone overflow the target.
    tuning = config.summarization.compaction().model_copy(
        update={"specifics_ratio": 0, "max_summary_tokens": max_summary_tokens}
    )
    compactor = create_compactor(
        model=ExtractiveProvider(), memory=h.store.archive,
        config=tuning, model_name="test", budget=budget,
    )  # fmt: skip
    h.components.processor._runtime = StaticRuntime(h.store, compactor)
    return h


async def _compacted(h: Harness) -> None:
    """c1 over budget and compacted once, its completion applied."""
    await over_budget(h)
    while h.tally().outstanding is not None:  # more than one: messages past the cut
        await _run_last_command(h)


async def _request(h: Harness, event: RecompactRequest | RestoreRequest) -> None:
    await h.components.accounting.handle(
        h.record(NAMES.control, event.conversation_id, event.model_dump_json())
    )


def recompact(request_id: str = "r-1") -> RecompactRequest:
    return RecompactRequest(
        request_id=request_id, conversation_id="c1", requester="ops",
        requested_at=datetime.now(UTC),
    )  # fmt: skip


def restore(request_id: str = "u-1", batch_id: str | None = None) -> RestoreRequest:
    return RestoreRequest(
        request_id=request_id, conversation_id="c1", batch_id=batch_id, requester="ops",
        requested_at=datetime.now(UTC),
    )  # fmt: skip


def clip_events(h: Harness) -> list[ClipArchiveEvent]:
    return [
        ClipArchiveEvent.model_validate_json(p.value or b"")
        for p in h.publisher.on("clip_archives")
    ]


async def _run_last_command(h: Harness) -> CompactionCommand:
    command = h.commands()[-1]
    await h.components.processor.compact(command)
    completed = h.completions()[-1]
    await h.control(completed)
    return command


def live_tokens(h: Harness) -> int:
    rows = [r.message for (cid, _), r in h.store.messages.items() if cid == "c1"]
    return estimate_history_tokens(rows)


async def test_recompact_rebuilds_every_live_batch_from_its_raw_turns_as_one_compaction() -> None:
    h = budgeted()
    await _compacted(h)
    before = await h.store.archive.live_batches("c1")
    await _request(h, recompact())
    command = h.commands()[-1]
    assert (command.action, command.request_id, command.reason) == ("recompact", "r-1", "request")
    assert command.compaction_id == request_compaction_id("c1", "r-1")
    await _run_last_command(h)
    after = await h.store.archive.live_batches("c1")
    assert {b.id for b in after}.isdisjoint(b.id for b in before)
    assert all(b.compaction_id == command.compaction_id for b in after)
    assert all(h.store.batches[b.id].superseded_by for b in before)
    assert h.store.applied >= {command.compaction_id}
    event = clip_events(h)[-1]
    assert (event.action, event.request_id, event.compaction_id) == (
        "recompact", "r-1", command.compaction_id,
    )  # fmt: skip
    assert live_tokens(h) <= BUDGET_TOKENS  # the kept messages alone take 106 of 160
    # Raw turns point at the batch that now summarises them.
    assert {a.batch_id for a in h.store.archived.values()} <= {b.id for b in after}


async def test_a_request_delivered_again_is_the_same_compaction_applied_once() -> None:
    h = budgeted()
    await _compacted(h)
    await _request(h, recompact())
    await _request(h, recompact())  # a redelivery while outstanding: nothing new
    assert sum(c.action == "recompact" for c in h.commands()) == 1
    await _run_last_command(h)
    batches = dict(h.store.batches)
    await _request(h, recompact())  # delivered again after it completed
    again = await _run_last_command(h)
    assert again.compaction_id == request_compaction_id("c1", "r-1")
    assert h.store.batches == batches  # replayed, not redone
    assert sample(h.components.metrics, "compactor_compactions_noop_total", reason="replayed") == 1


async def test_a_request_waits_for_the_outstanding_command_then_goes() -> None:
    h = budgeted()
    command = await over_budget(h)  # outstanding, not run yet
    await _request(h, restore())
    assert [c.action for c in h.commands()] == ["compact"]
    assert [q.request_id for q in h.tally().queued] == ["u-1"]
    await h.components.processor.compact(command)
    await h.control(h.completions()[-1])
    assert [c.action for c in h.commands()] == ["compact", "restore"]
    assert h.tally().request is not None and h.tally().queued == ()


async def test_restore_brings_the_newest_turns_back_within_the_target_and_names_the_rest() -> None:
    h = budgeted()
    await _compacted(h)
    *_, batch = await h.store.archive.live_batches("c1")
    # Room for some of its turns (target 320) beside a summary of the others of at
    # most 20 tokens: a summary as long as the turns it stands for leaves none.
    budgeted(h, model_max_tokens=800, max_summary_tokens=20)
    await _request(h, restore())
    await _run_last_command(h)
    event = clip_events(h)[-1]
    assert event.action == "restore" and event.restored_message_ids
    restored = set(event.restored_message_ids)
    assert restored | set(event.not_restored_message_ids) == set(batch.batch.source_message_ids)
    assert all(("c1", i) in h.store.messages for i in restored)
    assert not any(("c1", i) in h.store.archived for i in restored)
    assert set(event.kept_message_ids) >= restored
    assert live_tokens(h) <= 320
    assert h.store.batches[batch.id].superseded_by is not None


async def test_restore_of_a_batch_that_is_not_live_is_a_noop_that_says_so() -> None:
    h = budgeted()
    await _compacted(h)
    await _request(h, restore(batch_id="no-such-batch"))
    outcome = await h.components.processor.compact(h.commands()[-1])
    assert isinstance(outcome, Noop) and "no live batch no-such-batch" in outcome.reason


async def test_an_ordinary_command_and_clip_archive_leave_the_request_fields_out() -> None:
    h = budgeted()
    await _compacted(h)
    raw: Any = h.publisher.on("commands")[0].value or b""
    assert b'"action"' not in raw and b"request_id" not in raw
    assert b'"action"' not in (h.publisher.on("clip_archives")[0].value or b"")


async def test_a_request_for_a_conversation_that_does_not_exist_sends_nothing() -> None:
    h = budgeted()
    await _request(h, recompact())
    assert h.commands() == [] and h.components.table.get("c1") is None


async def test_a_noop_request_does_not_stall_the_conversation() -> None:
    from core.domain.budget import BudgetConfig
    from core.domain.tally import (
        Completion,
        ConversationTally,
        OperatorRequest,
        on_completion,
        on_request,
    )

    budget = BudgetConfig(context_budget=0.5, model_max_tokens=400, compact_at=0.9, idle_seconds=5)
    tally = ConversationTally(conversation_id="c1", token_total=190)  # over the trigger only
    tally, issued = on_request(tally, OperatorRequest(action="restore", request_id="u"), 0.0)
    assert issued and tally.outstanding is not None
    noop = Completion(
        compaction_id=tally.outstanding, status="noop", messages_compressed=0,
        tokens_removed=0, tokens_added=0,
    )  # fmt: skip
    tally, _ = on_completion(tally, noop, budget, 1.0)
    assert not tally.stalled and tally.request is None
