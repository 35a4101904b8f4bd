"""Recompact and restore applied to a real PostgreSQL (issue 18, part 2): one
transaction each, raw turns relinked or moved back, idempotent by compaction id."""

from __future__ import annotations

import pytest

from core.adapters.llm.extractive import ExtractiveProvider
from core.adapters.postgres.store import PostgresStore
from core.compaction.compactor import PipelineCompactor
from core.compaction.factory import create_compactor
from core.domain.budget import BudgetConfig
from core.domain.compaction import (
    CompactionConfig,
    CompactionPlan,
    Planned,
    PlanOutcome,
    StoredTokens,
)
from core.ports.storage import AlreadyApplied, Applied, CompactionOutbox, HistoryConflictError
from tests.support.plans import CONV, msg, save_all
from tests.support.stores import counts

pytestmark = pytest.mark.integration

BUDGET = BudgetConfig(context_budget=0.5, model_max_tokens=2000)  # 1,000 tokens, target 800


def compactor(store: PostgresStore) -> PipelineCompactor:
    config = CompactionConfig(
        keep_recent=2, chunk_size=4, min_chunk_tokens=0, retry_backoff_seconds=0
    )
    return create_compactor(
        model=ExtractiveProvider(), memory=store.archive, config=config, model_name="x",
        budget=BUDGET,
    )  # fmt: skip


async def _compacted(store: PostgresStore) -> PipelineCompactor:
    turns = [
        msg(i, " ".join(f"fact{i}-{j} about the offsite." for j in range(12))) for i in range(12)
    ]
    await save_all(store, turns)
    pipeline = compactor(store)
    outcome = await pipeline.plan(await store.history.load_history(CONV), CONV, compaction_id="c-1")
    await _apply(store, _plan_of(outcome))
    return pipeline


def _plan_of(outcome: PlanOutcome) -> CompactionPlan:
    assert isinstance(outcome, Planned), outcome
    return outcome.plan


async def _apply(store: PostgresStore, plan: CompactionPlan) -> None:
    """As the processor applies it: with the stored token counts its completion
    announces, which the store checks (a restore's turns with their own)."""
    inputs = await store.history.compaction_inputs(plan.compaction_id, CONV, up_to_seq=None)
    outbox = CompactionOutbox((), StoredTokens.of(plan, inputs.stored_tokens))
    assert await store.compactions.apply_compaction(plan, outbox) == Applied()


async def test_recompact_supersedes_the_live_batches_and_relinks_their_raw_turns(
    pg_store: PostgresStore,
) -> None:
    pipeline = await _compacted(pg_store)
    before = await pg_store.archive.live_batches(CONV)
    history = await pg_store.history.load_history(CONV)
    plan = _plan_of(await pipeline.recompact(history, CONV, compaction_id="r-1"))
    await _apply(pg_store, plan)
    after = await pg_store.archive.live_batches(CONV)
    assert after and all(b.compaction_id == "r-1" for b in after)
    rows = await pg_store.pool.fetch(
        "SELECT id, superseded_by FROM archival_memory WHERE id = ANY($1::text[])",
        [b.id for b in before],
    )
    assert all(r["superseded_by"] is not None for r in rows)
    links = {
        r["batch_id"] for r in await pg_store.pool.fetch("SELECT batch_id FROM archived_messages")
    }
    assert links <= {b.id for b in after}  # every raw turn points at a live batch
    live = await pg_store.history.load_history(CONV)
    assert [m.id for m in live][1:] == [m.id for m in history][1:]  # the kept messages stay
    tokens, _ = await counts(pg_store, CONV)
    assert tokens <= BUDGET.budget_tokens
    assert await pg_store.compactions.apply_compaction(plan) == AlreadyApplied()


async def test_restore_moves_the_newest_turns_back_with_their_arrival_numbers(
    pg_store: PostgresStore,
) -> None:
    pipeline = await _compacted(pg_store)
    *_, newest = await pg_store.archive.live_batches(CONV)
    seqs = {
        r["id"]: r["seq"]
        for r in await pg_store.pool.fetch("SELECT id, seq FROM archived_messages")
    }
    outcome = await pipeline.restore(
        await pg_store.history.load_history(CONV), CONV, compaction_id="u-1", batch_id=newest.id
    )
    plan = _plan_of(outcome)
    assert plan.restored_message_ids
    stored_counts = await pg_store.pool.fetch(
        "SELECT token_estimate FROM archived_messages WHERE id = ANY($1::text[])",
        list(plan.restored_message_ids),
    )
    assert plan.restored_tokens == sum(r["token_estimate"] for r in stored_counts) > 0
    await _apply(pg_store, plan)
    back = await pg_store.pool.fetch(
        "SELECT id, seq, kind FROM messages WHERE id = ANY($1::text[])",
        list(plan.restored_message_ids),
    )
    assert {r["id"]: r["seq"] for r in back} == {i: seqs[i] for i in plan.restored_message_ids}
    archived = await pg_store.pool.fetchval(
        "SELECT count(*) FROM archived_messages WHERE id = ANY($1::text[])",
        list(plan.restored_message_ids),
    )
    assert archived == 0
    tokens, _ = await counts(pg_store, CONV)
    assert tokens <= BUDGET.target_tokens
    superseded = await pg_store.pool.fetchval(
        "SELECT superseded_by FROM archival_memory WHERE id = $1", newest.id
    )
    assert superseded is not None
    # A second restore of the same turns (a stale plan) changes nothing.
    with pytest.raises(HistoryConflictError):
        await pg_store.compactions.apply_compaction(
            plan.model_copy(update={"compaction_id": "u-2"})
        )
