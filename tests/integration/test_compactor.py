"""The whole compaction pipeline against a real PostgreSQL and the real LLM
SDKs talking HTTP to the local wire-protocol server."""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from core.adapters.llm.anthropic import AnthropicProvider
from core.adapters.llm.openai_compat import OpenAICompatProvider
from core.adapters.postgres.store import PostgresStore
from core.domain.budget import BudgetConfig, compaction_due
from core.domain.clip_archive import is_clip_archive, parse_clip_archive
from core.domain.compaction import CompactionConfig
from core.domain.messages import ConversationMessage, ToolCall
from core.domain.prompts import DEFAULT_DIRECTIVE, DEFAULT_SYSTEM_PROMPT
from core.domain.tokens import estimate_history_tokens, estimate_message_tokens
from tests.support.builders import message
from tests.support.compaction import applying_compactor
from tests.support.llm_server import (
    ANTHROPIC_PATH,
    Delay,
    HTTPError,
    LLMTestServer,
    RateLimited,
    Reply,
    ServerError,
    prose,
    turn_words,
)
from tests.support.stores import saved, totals

pytestmark = pytest.mark.integration


@pytest.fixture
async def llm() -> AsyncIterator[LLMTestServer]:
    counter = itertools.count(1)

    def numbered(request: Any) -> str:
        return (
            f"Summary {next(counter)} of {len(request.messages)} messages: {turn_words(request)}."
        )

    async with LLMTestServer(responder=numbered) as server:
        yield server


class Sleeps:
    """Records backoff instead of waiting, so retry tests take no wall time.

    ``clock`` is the time the compactor sees: wall time plus what it "slept",
    so the provider guard's pauses and cool-downs agree with the sleeps.
    """

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)

    def clock(self) -> float:
        return time.monotonic() + sum(self.calls)


def conversation(n: int, conv: str = "conv-1", start: int = 0) -> list[ConversationMessage]:
    prefix = "m" if conv == "conv-1" else f"{conv}-"
    roles = ("user", "assistant")
    return [
        message(
            i,
            roles[i % 2],
            f"turn {i}: " + "we talked about the payments deploy " * 3,
            conversation_id=conv,
            id_prefix=prefix,
        )
        for i in range(start, start + n)
    ]


async def seed(store: PostgresStore, msgs: list[ConversationMessage]) -> None:
    for m in msgs:
        await saved(store, m, estimate_message_tokens(m))


def make(
    store: PostgresStore,
    llm: LLMTestServer,
    sleeps: Sleeps | None = None,
    provider: str = "anthropic",
    **config: Any,
):  # type: ignore[no-untyped-def]
    defaults: dict[str, Any] = {
        "chunk_size": 3,
        "min_chunk_tokens": 0,  # chunks of chunk_size turns, however short (these tests count calls)
        "keep_recent": 2,
        "timeout_seconds": 5,
        "retry_backoff_seconds": 0.5,
    }
    defaults.update(config)
    budget = defaults.pop("budget", None)
    sleeps = sleeps or Sleeps()
    if provider == "anthropic":
        model: Any = AnthropicProvider("test-key", base_url=llm.base_url, prompt_caching=False)
    else:
        model = OpenAICompatProvider("test-key", base_url=llm.openai_base_url)
    return applying_compactor(
        store=store,
        model=model,
        config=CompactionConfig(**defaults),
        model_name="claude-test",
        budget=budget,
        sleep=sleeps,
        clock=sleeps.clock,
    )


async def counts(store: PostgresStore, conv: str = "conv-1") -> tuple[int, int, int]:
    async with store.pool.acquire() as conn:
        return (
            await conn.fetchval("SELECT count(*) FROM messages WHERE conversation_id = $1", conv),
            await conn.fetchval(
                "SELECT count(*) FROM archival_memory WHERE conversation_id = $1", conv
            ),
            await conn.fetchval(
                "SELECT count(*) FROM compactions WHERE conversation_id = $1", conv
            ),
        )


async def test_over_budget_history_is_compressed__context_compaction_AC1_1(
    pg_store: PostgresStore, llm: LLMTestServer
) -> None:
    msgs = conversation(12)
    await seed(pg_store, msgs)
    budget = BudgetConfig(context_budget=0.5, model_max_tokens=600)
    assert compaction_due(estimate_history_tokens(msgs), budget)
    result = await make(pg_store, llm).compress(msgs, "conv-1")
    assert not result.failed
    assert result.batches_created >= 1
    assert len(result.history) < len(msgs)
    assert result.tokens_estimate_before == estimate_history_tokens(msgs)
    assert (
        result.tokens_estimate_after
        == estimate_history_tokens(result.history)
        < result.tokens_estimate_before
    )
    assert not compaction_due(estimate_history_tokens(result.history), budget)


async def test_messages_are_chunked_by_chunk_size__context_compaction_AC1_2(
    pg_store: PostgresStore, llm: LLMTestServer
) -> None:
    msgs = conversation(12)  # 10 compressible with keep_recent=2 → chunks of 3,3,3,1
    await seed(pg_store, msgs)
    result = await make(pg_store, llm).compress(msgs, "conv-1")
    assert len(llm.requests_to(ANTHROPIC_PATH)) == 4
    assert [b.batch.message_count for b in result.batches] == [3, 3, 3, 1]


async def test_each_chunk_carries_the_running_summary__context_compaction_AC1_3(
    pg_store: PostgresStore, llm: LLMTestServer
) -> None:
    msgs = conversation(11)
    await seed(pg_store, msgs)
    await make(pg_store, llm).compress(msgs, "conv-1")
    bodies = [c.body for c in llm.requests_to(ANTHROPIC_PATH)]
    assert len(bodies) == 3
    # Anthropic lifts system-role messages into the system field.
    assert bodies[0]["system"] == DEFAULT_SYSTEM_PROMPT
    for i in (1, 2):  # the running summary opens the request's data fence
        assert re.match(
            re.escape(DEFAULT_SYSTEM_PROMPT + "\n\nPrevious summary of conversation:\n")
            + r'<conversation-data id="[a-p]{6,64}">\nSummary '
            + str(i)
            + " of",
            bodies[i]["system"],
        )


async def test_batches_have_depth_time_range_and_count__context_compaction_AC1_4(
    pg_store: PostgresStore, llm: LLMTestServer
) -> None:
    msgs = conversation(9)
    await seed(pg_store, msgs)
    result = await make(pg_store, llm).compress(msgs, "conv-1")
    by_id = {m.id: m for m in msgs}
    for stored in result.batches:
        sources = [by_id[i] for i in stored.batch.source_message_ids]
        assert stored.batch.depth == 0
        assert stored.batch.message_count == len(sources)
        assert stored.batch.start_time == min(m.created_at for m in sources)
        assert stored.batch.end_time == max(m.created_at for m in sources)
    assert sum(b.batch.message_count for b in result.batches) == 7


async def test_compressed_messages_are_deleted__context_compaction_AC1_5(
    pg_store: PostgresStore, llm: LLMTestServer
) -> None:
    msgs = conversation(9)
    await seed(pg_store, msgs)
    result = await make(pg_store, llm).compress(msgs, "conv-1")
    async with pg_store.pool.acquire() as conn:
        remaining = await conn.fetch(
            "SELECT id FROM messages WHERE id = ANY($1::text[])", [m.id for m in msgs]
        )
    assert {r["id"] for r in remaining} == {m.id for m in msgs[-2:]}
    assert set(result.compressed_message_ids) == {m.id for m in msgs[:7]}


async def test_recent_messages_kept_verbatim__context_compaction_AC1_6(
    pg_store: PostgresStore, llm: LLMTestServer
) -> None:
    msgs = conversation(9)
    await seed(pg_store, msgs)
    result = await make(pg_store, llm, keep_recent=3).compress(msgs, "conv-1")
    assert result.history[1:] == tuple(msgs[-3:])
    assert (await pg_store.history.load_history("conv-1"))[1:] == msgs[-3:]


@pytest.mark.parametrize(
    "failure", [ServerError(500), HTTPError(400, "bad request"), RateLimited(retry_after=0.1)]
)
async def test_failed_model_call_leaves_history_unchanged__context_compaction_AC1_7(
    pg_store: PostgresStore, llm: LLMTestServer, failure: Any
) -> None:
    msgs = conversation(12)
    await seed(pg_store, msgs)
    before = await pg_store.history.load_history("conv-1")
    # The first chunk succeeds; the second fails on every attempt.
    llm.enqueue(Reply(text="chunk one summary"), failure, failure, failure)
    result = await make(pg_store, llm, max_retries=2).compress(msgs, "conv-1")
    assert result.failed and result.reason
    assert result.history == tuple(msgs)
    assert (result.batches_created, result.messages_compressed) == (0, 0)
    assert result.tokens_estimate_after == result.tokens_estimate_before
    assert await pg_store.history.load_history("conv-1") == before
    assert await counts(pg_store) == (12, 0, 0)


async def test_first_compaction_has_no_prior_summary_and_depth_zero__context_compaction_AC1_8(
    pg_store: PostgresStore, llm: LLMTestServer
) -> None:
    msgs = conversation(6)
    await seed(pg_store, msgs)
    result = await make(pg_store, llm, chunk_size=10).compress(msgs, "conv-1")
    first = llm.requests_to(ANTHROPIC_PATH)[0].body
    assert first["system"] == DEFAULT_SYSTEM_PROMPT  # no "Previous summary" lifted into it
    assert all(m["role"] != "system" for m in first["messages"])
    assert [b.batch.depth for b in result.batches] == [0]


async def test_clip_archive_is_first_system_message__context_compaction_AC3_3(
    pg_store: PostgresStore, llm: LLMTestServer
) -> None:
    msgs = conversation(12)
    await seed(pg_store, msgs)
    result = await make(pg_store, llm).compress(msgs, "conv-1")
    clip = result.history[0]
    assert clip.role == "system" and is_clip_archive(clip)
    stored = await pg_store.history.load_history("conv-1")
    assert stored[0] == clip
    parsed = parse_clip_archive(clip.content)
    assert (parsed.messages_compressed, parsed.cycles, parsed.total_batches) == (10, 1, 4)


async def test_each_batch_is_archived_with_its_label__context_compaction_AC4_1_AC4_2(
    pg_store: PostgresStore, llm: LLMTestServer
) -> None:
    msgs = conversation(12)
    await seed(pg_store, msgs)
    result = await make(pg_store, llm).compress(msgs, "conv-1")
    async with pg_store.pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT id, label, content FROM archival_memory WHERE conversation_id = 'conv-1' ORDER BY id"
        )
    assert len(rows) == result.batches_created == 4
    for stored in result.batches:
        assert stored.label == "compaction-batch-conv-1-" + stored.batch.end_time.strftime(
            "%Y-%m-%dT%H:%M:%S.000Z"
        )
    assert {r["label"] for r in rows} == {b.label for b in result.batches}


async def test_archived_batches_found_by_memory_read__context_compaction_AC4_3(
    pg_store: PostgresStore, llm: LLMTestServer
) -> None:
    msgs = conversation(6)
    await seed(pg_store, msgs)
    llm.enqueue(
        Reply(text="The team agreed to move the payments deploy to Tuesday because of the freeze.")
    )
    await make(pg_store, llm, chunk_size=10).compress(msgs, "conv-1")
    found = await pg_store.memory.memory_read("payments freeze", conversation_id="conv-1")
    assert found.hits and "Tuesday" in found.hits[0].content
    assert found.hits[0].label.startswith("compaction-batch-conv-1-")


async def test_repeated_cycles_resummarize_and_keep_counting(
    pg_store: PostgresStore, llm: LLMTestServer
) -> None:
    compactor = make(
        pg_store, llm, chunk_size=2, keep_recent=2, clip_first=1, clip_last=1, resummarize_buffer=1
    )
    history: list[ConversationMessage] = []
    for cycle in range(3):
        fresh = conversation(6, start=cycle * 6)
        await seed(pg_store, fresh)
        history = [*history, *fresh]
        result = await compactor.compress(history, "conv-1")
        assert not result.failed, result.reason
        history = list(result.history)
    clip = parse_clip_archive(history[0].content)
    assert clip.cycles == 3
    assert (
        clip.messages_compressed == 16
    )  # 4 + (2 + 4 + 2)... every compressed original message once
    live = await pg_store.archive.live_batches("conv-1")
    assert len(live) <= 1 + 1 + 1
    assert max(b.batch.depth for b in live) >= 1
    assert sum(b.batch.message_count for b in live) == 16
    # the second and third cycles folded the prior clip-archive in as the previous summary
    resummarize_calls = [
        c
        for c in llm.requests_to(ANTHROPIC_PATH)
        if "Summary batch:" in (c.body.get("system") or "")
    ]
    assert (
        resummarize_calls
        and resummarize_calls[0].body["messages"][-1]["content"] == DEFAULT_DIRECTIVE
    )
    # superseded batches stay searchable
    async with pg_store.pool.acquire() as conn:
        superseded = await conn.fetchval(
            "SELECT count(*) FROM archival_memory WHERE superseded_by IS NOT NULL"
        )
    assert superseded >= 2
    # only one clip-archive row survives
    stored = await pg_store.history.load_history("conv-1")
    assert sum(is_clip_archive(m) for m in stored) == 1


async def test_second_compaction_folds_in_prior_clip_archive(
    pg_store: PostgresStore, llm: LLMTestServer
) -> None:
    compactor = make(pg_store, llm, chunk_size=10)
    first = conversation(6)
    await seed(pg_store, first)
    result = await compactor.compress(first, "conv-1")
    more = conversation(6, start=6)
    await seed(pg_store, more)
    llm.reset()
    await compactor.compress([*result.history, *more], "conv-1")
    body = llm.requests_to(ANTHROPIC_PATH)[0].body
    assert re.search(
        r'Previous summary of conversation:\n<conversation-data id="[a-p]{6,64}">\n'
        + re.escape("[Context Summary — 4 messages compressed across 1 compaction cycles]"),
        body["system"],
    )


async def test_retried_compaction_is_a_no_op(pg_store: PostgresStore, llm: LLMTestServer) -> None:
    msgs = conversation(12)
    await seed(pg_store, msgs)
    compactor = make(pg_store, llm)
    first = await compactor.compress(msgs, "conv-1", compaction_id="cmp-1")
    after_first = await counts(pg_store)
    calls = len(llm.requests)
    again = await compactor.compress(msgs, "conv-1", compaction_id="cmp-1")
    assert again.already_applied and not again.failed
    assert await counts(pg_store) == after_first
    assert len(llm.requests) == calls  # no LLM spend on a replay
    assert first.batches_created == after_first[1]


def jitter_at_its_top(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backoff is drawn at random up to its window (full jitter): drawn at the
    top, the window is what a test sees."""
    monkeypatch.setattr("tenacity.wait.random.uniform", lambda low, high: high)


async def test_timeout_halves_the_chunk_and_backs_off(
    pg_store: PostgresStore, llm: LLMTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    jitter_at_its_top(monkeypatch)
    msgs = conversation(10)
    await seed(pg_store, msgs)
    sleeps = Sleeps()
    llm.enqueue(Delay(3.0))
    result = await make(
        pg_store, llm, sleeps, chunk_size=8, timeout_seconds=0.5, max_retries=2
    ).compress(msgs, "conv-1")
    assert not result.failed, result.reason
    sizes = [
        sum(m["role"] != "system" for m in c.body["messages"]) - 1
        for c in llm.requests_to(ANTHROPIC_PATH)
    ]
    assert sizes == [8, 4, 4]
    assert sleeps.calls == [0.5]
    assert [b.batch.message_count for b in result.batches] == [4, 4]


async def test_rate_limit_waits_for_retry_after(
    pg_store: PostgresStore, llm: LLMTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    jitter_at_its_top(monkeypatch)
    msgs = conversation(6)
    await seed(pg_store, msgs)
    sleeps = Sleeps()
    llm.enqueue(RateLimited(retry_after=7), ServerError(503))
    result = await make(pg_store, llm, sleeps, chunk_size=10).compress(msgs, "conv-1")
    assert not result.failed
    assert sleeps.calls == [7, 1.0]  # max(backoff, retry-after), then up to 0.5 * 2^1


async def test_circuit_opens_after_consecutive_failures(
    pg_store: PostgresStore, llm: LLMTestServer
) -> None:
    msgs = conversation(6)
    await seed(pg_store, msgs)
    compactor = make(
        pg_store,
        llm,
        chunk_size=10,
        max_retries=0,
        max_consecutive_failures=2,
        circuit_cooldown_seconds=3600,
    )
    # A request the provider rejects is the conversation's own failure.
    llm.enqueue(HTTPError(400, "prompt too long"), HTTPError(400, "prompt too long"))
    assert (await compactor.compress(msgs, "conv-1")).failed
    assert (await compactor.compress(msgs, "conv-1")).failed
    calls = len(llm.requests)
    third = await compactor.compress(msgs, "conv-1")
    assert third.failed and third.reason and third.reason.startswith("circuit open")
    assert len(llm.requests) == calls
    other = conversation(6, conv="conv-2")
    await seed(pg_store, other)
    assert not (await compactor.compress(other, "conv-2")).failed


async def test_a_provider_outage_opens_the_provider_breaker_not_the_conversations(
    pg_store: PostgresStore, llm: LLMTestServer
) -> None:
    """5xx for everyone: after provider_failure_threshold failures in a row,
    from three conversations, every compaction fails fast without a request;
    no conversation's own circuit opened, so all compact once the probe works."""
    convs = {f"conv-{i}": conversation(6, conv=f"conv-{i}") for i in range(1, 4)}
    for msgs in convs.values():
        await seed(pg_store, msgs)
    sleeps = Sleeps()
    compactor = make(
        pg_store,
        llm,
        sleeps,
        chunk_size=10,
        max_retries=0,
        max_consecutive_failures=1,
        provider_failure_threshold=3,
        provider_cooldown_seconds=30,
    )
    llm.enqueue(ServerError(500), ServerError(502), ServerError(503))
    for conv, msgs in convs.items():
        assert (await compactor.compress(msgs, conv)).failed
    assert compactor.provider_guard.state() == "open"
    sent = len(llm.requests)
    refused = await compactor.compress(convs["conv-1"], "conv-1")
    assert refused.failed and refused.reason is not None
    assert refused.reason.startswith("ProviderUnavailableError: LLM provider open: retry in")
    assert len(llm.requests) == sent  # failed fast
    assert all(compactor.breaker.state(conv) == "closed" for conv in convs)

    await sleeps(30)  # the cool-down passes: the next call is the probe
    assert compactor.provider_guard.state() == "half_open"
    for conv, msgs in convs.items():
        result = await compactor.compress(msgs, conv)
        assert not result.failed, result.reason
    assert compactor.provider_guard.state() == "closed"


async def test_history_changed_underneath_writes_nothing(
    pg_store: PostgresStore, llm: LLMTestServer
) -> None:
    msgs = conversation(8)
    await seed(pg_store, msgs)
    async with pg_store.pool.acquire() as conn:
        await conn.execute("DELETE FROM messages WHERE id = $1", msgs[0].id)
    result = await make(pg_store, llm, chunk_size=10).compress(msgs, "conv-1")
    assert result.failed and "history changed" in (result.reason or "")
    assert await counts(pg_store) == (7, 0, 0)


async def test_tool_turns_reach_the_model_and_stay_paired(
    pg_store: PostgresStore, llm: LLMTestServer
) -> None:
    call = ToolCall(id="call-9", name="deploy", arguments={"service": "payments"})
    msgs = [
        *conversation(4),
        message(4, "assistant", "deploying", tool_calls=[call]),
        message(5, "tool", "deploy ok", tool_call_id="call-9"),
        message(6, "user", "great, thanks"),
    ]
    await seed(pg_store, msgs)
    result = await make(pg_store, llm, chunk_size=10, keep_recent=2).compress(msgs, "conv-1")
    assert [m.id for m in result.history[1:]] == ["m00004", "m00005", "m00006"]


@pytest.mark.parametrize(("provider", "stop"), [("anthropic", "max_tokens"), ("openai", "length")])
async def test_a_summary_cut_at_max_tokens_never_takes_effect(
    pg_store: PostgresStore, llm: LLMTestServer, provider: str, stop: str
) -> None:
    """The provider says it stopped at ``max_tokens``: the summary stops mid-way,
    and the gate refuses the plan in the store's transaction (the processor then
    falls back to the extractive summariser)."""
    msgs = conversation(6)
    await seed(pg_store, msgs)
    before = await pg_store.history.load_history("conv-1")
    cut = "We talked about the payments deploy: the team moved it to Tuesday because"
    llm.enqueue(Reply(text=cut, stop_reason=stop), path=None)
    result = await make(pg_store, llm, provider=provider, chunk_size=6).compress(msgs, "conv-1")
    assert result.failed and result.reason == "1 summary cut at max_tokens", result.reason
    assert await pg_store.history.load_history("conv-1") == before
    assert await counts(pg_store) == (6, 0, 0)


async def test_pipeline_through_openai_compatible_adapter(
    pg_store: PostgresStore, llm: LLMTestServer
) -> None:
    msgs = conversation(8)
    await seed(pg_store, msgs)
    result = await make(
        pg_store, llm, provider="openai", chunk_size=3, prompt="Custom archivist prompt."
    ).compress(msgs, "conv-1")
    assert not result.failed
    calls = llm.requests_to("/v1/chat/completions")
    assert len(calls) == 2
    second = calls[1].body["messages"]
    assert second[0] == {"role": "system", "content": "Custom archivist prompt."}
    assert second[1]["role"] == "system" and second[1]["content"].startswith(
        "Previous summary of conversation:\n"
    )
    assert second[-1] == {"role": "user", "content": DEFAULT_DIRECTIVE}
    assert calls[0].body["temperature"] == 0 and calls[0].body["max_tokens"] == 1024


def at_the_cap(request: Any) -> str:
    """Summaries as long as ``max_tokens`` allows: the replay where batches at the
    ``max_summary_tokens`` cap left the clip-archive alone near the budget."""
    return prose(4 * (request.max_tokens or 1024), turn_words(request))


async def stored_total(store: PostgresStore, conv: str = "conv-1") -> int:
    return (await totals(store, conv)).tokens


async def test_every_cycle_leaves_the_history_under_the_target(pg_store: PostgresStore) -> None:
    budget = BudgetConfig(context_budget=1.0, model_max_tokens=1200)  # target 960
    async with LLMTestServer(responder=at_the_cap) as server:
        compactor = make(
            pg_store,
            server,
            chunk_size=3,
            keep_recent=3,
            max_summary_tokens=1024,
            clip_first=1,
            clip_last=1,
            resummarize_buffer=1,
            budget=budget,
        )
        history: list[ConversationMessage] = []
        for cycle in range(3):
            fresh = conversation(12, start=cycle * 12)
            await seed(pg_store, fresh)
            history = [*history, *fresh]
            result = await compactor.compress(history, "conv-1")
            assert not result.failed and not result.over_target, result.reason
            assert result.tokens_estimate_after <= 960
            assert await stored_total(pg_store) == result.tokens_estimate_after
            history = await pg_store.history.load_history("conv-1")
            assert history == list(result.history)
            fitted = [r for r in server.requests_to(ANTHROPIC_PATH) if r.body["max_tokens"] < 1024]
            assert fitted, "the clip-archive was re-summarised at a smaller max_tokens"
            server.reset()
    clip = parse_clip_archive(history[0].content)
    assert (clip.cycles, clip.messages_compressed, clip.total_batches) == (3, 33, 1)
    live = await pg_store.archive.live_batches("conv-1")
    assert len(live) == 1 and live[0].id.endswith(":fitted")
    assert sum(b.batch.message_count for b in live) == 33
    async with pg_store.pool.acquire() as conn:
        superseded = await conn.fetchval(
            "SELECT count(*) FROM archival_memory WHERE superseded_by IS NOT NULL"
        )
        total = await conn.fetchval("SELECT count(*) FROM archival_memory")
    assert superseded == total - 1  # every earlier batch is still searchable
    found = await pg_store.memory.memory_read("payments freeze", conversation_id="conv-1")
    assert found.hits


async def test_a_history_left_over_budget_is_refitted_on_its_next_command(
    pg_store: PostgresStore,
) -> None:
    """What an earlier version left behind: clip-archive + kept over the budget and
    nothing left to compress. The next compaction shrinks the clip-archive."""
    msgs = conversation(14)
    await seed(pg_store, msgs)
    async with LLMTestServer(responder=at_the_cap) as server:
        stuck = await make(pg_store, server, chunk_size=4, max_summary_tokens=1024).compress(
            msgs, "conv-1"
        )
        budget = BudgetConfig(context_budget=0.5, model_max_tokens=4000)  # target 1,600
        assert await stored_total(pg_store) > budget.budget_tokens
        result = await make(
            pg_store, server, chunk_size=4, max_summary_tokens=1024, budget=budget
        ).compress(stuck.history, "conv-1")
    assert not result.failed and not result.over_target, result.reason
    assert (result.messages_compressed, result.batches_created) == (0, 1)
    assert await stored_total(pg_store) == result.tokens_estimate_after <= 1600
    assert await pg_store.history.load_history("conv-1") == list(result.history)
    assert result.history[1:] == stuck.history[1:]
    assert await counts(pg_store) == (3, 4, 2)  # clip + 2 kept; 3 batches + the fitted one
