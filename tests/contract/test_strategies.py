"""The strategy pipeline, cheapest first (issue 28), planned by the real pipeline
and applied to each store: old tool results cleared and an oversized message
offloaded without an LLM call, their full content archived where ``memory_read``
finds it, written once per compaction id and all or nothing; ``summarize`` runs
only when the cheap strategies leave the history over its target."""

from __future__ import annotations

from typing import Any

import pytest

from core.domain.budget import BudgetConfig
from core.domain.compaction import CompactionConfig
from core.domain.messages import ConversationMessage, ToolCall
from core.domain.strategies import ClearToolResultsConfig, StrategyConfig, StrategyName
from core.domain.tokens import estimate_message_tokens
from core.ports.model import ModelRequest, ModelResponse
from core.ports.storage import HistoryConflictError
from tests.contract.backends import Backend
from tests.support.compaction import PlanAndApply, applying_compactor
from tests.support.llm_server import model_turn_words
from tests.support.plans import CONV, msg
from tests.support.stores import saved


class CountingModel:
    """A model stand-in that counts its calls (a summary costs one)."""

    name = "counting"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        return ModelResponse(text=f"The agent read {model_turn_words(request)}.")


def agent_session(pairs: int, result_chars: int = 4000) -> list[ConversationMessage]:
    """A user ask, then ``pairs`` tool calls each answered by a large result
    naming a word of its own (``needle<i>``), then the assistant's answer."""
    history = [msg(0, "please review the repository")]
    for i in range(pairs):
        call = ToolCall(id=f"call-{i}", name="read_file", arguments={"path": f"src/f{i}.py"})
        history.append(msg(1 + 2 * i, "", role="assistant", tool_calls=[call]))
        body = f"needle{i} " + "line of source code " * (result_chars // 20)
        history.append(msg(2 + 2 * i, body, role="tool", tool_call_id=call.id))
    history.append(msg(1 + 2 * pairs, "the review is done", role="assistant"))
    return history


async def seeded(store: Any, history: list[ConversationMessage]) -> None:
    for m in history:
        await saved(store, m, estimate_message_tokens(m))


def compactor(
    store: Any,
    model: CountingModel,
    target: int,
    names: tuple[StrategyName, ...],
    **strategy: Any,
) -> PlanAndApply:
    """Target ``target`` tokens (a 1.0 budget ratio over ``target / 0.8`` tokens)."""
    config = CompactionConfig(
        keep_recent=2,
        chunk_size=4,
        min_chunk_tokens=0,
        strategies=StrategyConfig(strategies=names, **strategy),
    )
    budget = BudgetConfig(context_budget=1.0, model_max_tokens=int(target / 0.8))
    return applying_compactor(
        store=store, model=model, config=config, model_name="m", budget=budget
    )


async def test_old_tool_results_are_cleared_without_an_llm_call_and_stay_findable(
    store: Any, backend: Backend
) -> None:
    history = agent_session(5)  # ~5,000 tokens, 1,000 a result
    await seeded(store, history)
    model = CountingModel()
    names: tuple[StrategyName, ...] = ("clear_tool_results", "offload_oversized", "summarize")
    result = await compactor(store, model, 3500, names).compress(history, CONV)
    assert result.plan is not None and not result.over_target, result.reason
    assert model.requests == []  # no LLM call
    assert result.plan.usage.calls == 0 and result.plan.usage.input_tokens == 0
    cleared = [r.id for r in result.plan.replaced]
    assert cleared == [history[2].id, history[4].id]  # all but the last three results
    (freed,) = result.plan.strategies
    assert freed.strategy == "clear_tool_results" and freed.messages == 2
    assert freed.tokens_freed > 1500
    live = await store.history.load_history(CONV)
    assert [m.id for m in live] == [m.id for m in history]  # same messages, same places
    placeholder = live[2]
    assert placeholder.tool_call_id == "call-0"  # the pair stays a pair
    for part in ("read_file", "call-0", history[2].id):
        assert part in placeholder.content
    assert live[6:] == history[6:]  # the last three results as they were
    found = await store.memory.memory_read("needle0", conversation_id=CONV, sources="raw")
    assert [t.message_id for t in found.turns] == [history[2].id]
    stored = await backend.stored_tokens(CONV)
    assert stored[history[2].id] == estimate_message_tokens(placeholder)
    (logged,) = await store.archive.compaction_log(CONV)  # what the inspector shows
    assert logged.strategies == (freed,) and logged.usage is not None
    assert logged.usage.calls == 0


async def test_a_replayed_clearing_writes_nothing_twice(store: Any, backend: Backend) -> None:
    history = agent_session(5)
    await seeded(store, history)
    pipeline = compactor(store, CountingModel(), 3500, ("clear_tool_results",))
    first = await pipeline.compress(history, CONV, compaction_id="cmp-1")
    assert first.plan is not None and first.plan.replaced
    rows = await backend.rows()
    again = await pipeline.compress(history, CONV, compaction_id="cmp-1")
    assert again.already_applied and await backend.rows() == rows
    # A new compaction over the cleared history finds nothing more to clear.
    live = list(await store.history.load_history(CONV))
    later = await pipeline.compress(live, CONV, compaction_id="cmp-2")
    assert later.plan is None and await backend.rows() == rows


async def test_clearing_that_frees_too_little_is_skipped(store: Any) -> None:
    history = agent_session(5)
    await seeded(store, history)
    clearing = ClearToolResultsConfig(min_tokens_freed=100_000)
    pipeline = compactor(
        store, CountingModel(), 3500, ("clear_tool_results",), clear_tool_results=clearing
    )
    result = await pipeline.compress(history, CONV)
    assert result.plan is None
    assert await store.history.load_history(CONV) == history


async def test_an_excluded_tools_results_are_kept(store: Any) -> None:
    history = agent_session(5)
    await seeded(store, history)
    clearing = ClearToolResultsConfig(exclude_tools=("read_file",))
    pipeline = compactor(
        store, CountingModel(), 3500, ("clear_tool_results",), clear_tool_results=clearing
    )
    assert (await pipeline.compress(history, CONV)).plan is None


async def test_an_oversized_message_is_offloaded_to_a_preview(store: Any) -> None:
    paste = "start of the paste " + "filler words here " * 3000 + " uniqueword end of it"
    history = [msg(0, "hello"), msg(1, paste), msg(2, "thanks", role="assistant")]
    await seeded(store, history)
    model = CountingModel()
    names: tuple[StrategyName, ...] = ("offload_oversized", "summarize")
    pipeline = compactor(store, model, 8000, names, max_message_tokens=2000)
    result = await pipeline.compress(history, CONV)
    assert result.plan is not None and model.requests == []
    assert [(r.id, r.strategy) for r in result.plan.replaced] == [
        (history[1].id, "offload_oversized")
    ]
    preview = (await store.history.load_history(CONV))[1].content
    assert preview.startswith("[message offloaded:") and history[1].id in preview
    assert "start of the paste" in preview and "end of it" in preview
    found = await store.memory.memory_read("uniqueword", conversation_id=CONV, sources="raw")
    assert [t.message_id for t in found.turns] == [history[1].id]


async def test_summarize_runs_when_clearing_leaves_the_history_over_target(
    store: Any,
) -> None:
    history = agent_session(5)
    await seeded(store, history)
    model = CountingModel()
    names: tuple[StrategyName, ...] = ("clear_tool_results", "summarize")
    result = await compactor(store, model, 1200, names).compress(history, CONV)
    assert result.plan is not None and model.requests
    assert [s.strategy for s in result.plan.strategies] == ["clear_tool_results", "summarize"]
    # The summariser read placeholders, not the cleared results.
    sent = "".join(str(r.messages) for r in model.requests)
    assert "needle0" not in sent
    found = await store.memory.memory_read("needle0", conversation_id=CONV, sources="raw")
    assert [t.message_id for t in found.turns] == [history[2].id]
    assert "needle0" in found.turns[0].text  # the full result, not its placeholder


async def test_a_replacement_of_a_message_gone_conflicts_and_writes_nothing(
    store: Any, backend: Backend
) -> None:
    history = agent_session(5)
    await seeded(store, history)
    pipeline = compactor(store, CountingModel(), 3500, ("clear_tool_results",))
    planned = await pipeline.compactor.plan(history, CONV, compaction_id="cmp-1")
    plan = planned.plan  # type: ignore[union-attr]
    gone = plan.model_copy(update={"replaced": (*plan.replaced, plan.replaced[0].model_copy(
        update={"id": "no-such-message"}))})  # fmt: skip
    rows, live = await backend.rows(), await store.history.load_history(CONV)
    with pytest.raises(HistoryConflictError):
        await store.compactions.apply_compaction(gone)
    assert await backend.rows() == rows
    assert await store.history.load_history(CONV) == live
