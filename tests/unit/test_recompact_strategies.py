"""An operator's recompact runs the same pipeline as a compaction (issue 28): the
tenant's cheap strategies on the live history, then ``summarize`` (the live
batches rebuilt from their raw turns).

Why: recompact only re-summarised, so a conversation whose old tool results
were live kept them through every recompact, although the compaction that
would have run instead clears them first.
"""

from __future__ import annotations

import pytest

from core.adapters.llm.extractive import ExtractiveProvider
from core.domain.compaction import CompactionConfig, Planned
from core.domain.messages import ConversationMessage, ToolCall
from core.domain.strategies import CLEARED_PREFIX, StrategyConfig
from streams.worker.processor import write_plan
from tests.support.builders import history, message
from tests.support.compaction import applying_compactor
from tests.support.memory_store import InMemoryStore
from tests.support.stores import saved

pytestmark = pytest.mark.unit

RESULT = "the build log shows every step of the release pipeline and its timings " * 12


def tool_rounds(start: int, rounds: int) -> list[ConversationMessage]:
    out = []
    for n in range(rounds):
        call = ToolCall(id=f"call{n}", name="read_log", arguments={"n": n})
        out.append(message(start + 2 * n, "assistant", "", tool_calls=[call]))
        out.append(message(start + 2 * n + 1, "tool", f"log{n} {RESULT}", tool_call_id=call.id))
    return out


def config(*strategies: str) -> CompactionConfig:
    chosen = StrategyConfig(strategies=strategies) if strategies else StrategyConfig()
    return CompactionConfig(keep_recent=2, chunk_size=4, specifics_ratio=0, strategies=chosen)


async def test_recompact_clears_old_tool_results_as_a_compaction_would() -> None:
    store = InMemoryStore()
    chat = history(12)
    for turn in chat:
        await saved(store, turn, 10)
    summarising = applying_compactor(
        store=store, model=ExtractiveProvider(), model_name="m", config=config("summarize")
    )
    assert (await summarising.compress(chat, "conv-1")).plan is not None  # batches to rebuild
    for turn in tool_rounds(100, 5):
        await saved(store, turn, 200)
    live = tuple(await store.history.load_history("conv-1"))
    default = applying_compactor(
        store=store, model=ExtractiveProvider(), model_name="m", config=config()
    )
    outcome = await default.compactor.recompact(live, "conv-1", compaction_id="r-1")
    assert isinstance(outcome, Planned)
    plan = outcome.plan
    assert [s.strategy for s in plan.strategies] == ["clear_tool_results", "summarize"]
    assert plan.new_batches and plan.superseded  # the batches were rebuilt too
    assert sorted(r.id for r in plan.replaced) == ["m00101", "m00103"]  # all but the last 3
    await write_plan(store.compactions, plan)
    after = {m.id: m.content for m in await store.history.load_history("conv-1")}
    assert after["m00101"].startswith(CLEARED_PREFIX) and after["m00109"].startswith("log4")
