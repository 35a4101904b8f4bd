"""What a compaction cost (issue 18, part 3), per-tenant LLM budgets (part 4) and
the specifics ledger in the clip-archive event (part 1), against the in-memory store."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime

import pytest

from core.ports.model import ModelRequest, ModelResponse, ModelUsage
from core.ports.storage import ReadScope
from streams.events import ClipArchiveEvent
from streams.worker.processor import Compacted
from tests.support.llm_server import model_turn_words
from tests.support.metrics_text import sample
from tests.unit.worker.harness import Harness, harness, words

pytestmark = pytest.mark.unit


class GistModel:
    """An LLM that keeps each summary to a fixed gist: it drops every specific."""

    name = "anthropic"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        return ModelResponse(
            text=f"They discussed {model_turn_words(request)} and agreed on next steps.",
            usage=ModelUsage(
                input_tokens=300, output_tokens=20, cache_read_tokens=1000, cache_write_tokens=0
            ),
        )


ACME = [{"id": "acme", "llm_tokens_per_day": 1_000}]


async def compact_once(h: Harness, conversation: str = "c1", tenant: str | None = None) -> None:
    for i in range(8):
        text = words(20, f"topic{i}-") + (
            " Order ORD-55120 ships to /srv/a/b.toml." if i == 1 else ""
        )
        await h.message(i, text, conversation, tenant)
    (command, *_) = [c for c in h.commands() if c.conversation_id == conversation][-1:]
    outcome = await h.components.processor.compact(command)
    assert isinstance(outcome, Compacted), outcome


def clip_events(h: Harness) -> list[ClipArchiveEvent]:
    return [ClipArchiveEvent.model_validate_json(p.value) for p in h.publisher.on("clip_archives")]


async def test_a_compaction_records_its_usage_in_the_store_the_event_and_the_metrics() -> None:
    h = harness(model=GistModel())
    await compact_once(h, tenant="acme")
    (event,) = clip_events(h)
    usage = event.usage
    assert usage is not None and usage.summarizer == "anthropic" and usage.model == "test"
    assert usage.calls >= 1 and usage.input_tokens == 300 * usage.calls
    assert usage.cache_read_tokens == 1000 * usage.calls and not usage.fallback
    assert usage.cost_usd is None  # no price for model "test"
    (day,) = await h.store.usage.usage_by_day(scope=ReadScope.everything())
    assert (day.tenant_id, day.compactions, day.llm_calls) == ("acme", 1, usage.calls)
    assert day.day == datetime.fromtimestamp(h.clock.now, UTC).date()
    metrics = h.components.metrics
    assert (
        sample(metrics, "compactor_usage_llm_calls_total", provider="anthropic", model="test")
        == usage.calls
    )
    read = sample(
        metrics,
        "compactor_usage_tokens_total",
        provider="anthropic",
        model="test",
        kind="cache_read",
    )
    assert read == usage.cache_read_tokens


async def test_usage_is_read_through_the_scope_and_by_tenant_and_day() -> None:
    h = harness(model=GistModel())
    await compact_once(h, "c1", "acme")
    await compact_once(h, "c2", "globex")
    acme = await h.store.usage.usage_by_day(scope=ReadScope.of_tenant("acme"))
    assert [d.tenant_id for d in acme] == ["acme"]
    assert (
        await h.store.usage.usage_by_day(scope=ReadScope.of_tenant("acme"), tenant_id="globex")
        == []
    )
    both = await h.store.usage.usage_by_day(scope=ReadScope.everything())
    assert sorted(d.tenant_id or "" for d in both) == ["acme", "globex"]
    later = await h.store.usage.usage_by_day(scope=ReadScope.everything(), since=date(2100, 1, 1))
    assert later == []


async def test_a_spent_tenant_budget_falls_back_to_extractive_until_the_next_utc_day(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = GistModel()
    h = harness(model=model, tenants=ACME)
    await compact_once(h, "c1", "acme")  # 1,320 tokens a call: over the 1,000
    llm_calls = model.calls
    await compact_once(h, "c2", "acme")
    await compact_once(h, "c3", "other")  # a tenant without a budget is not held back
    events = {e.conversation_id: e for e in clip_events(h)}
    assert model.calls > llm_calls
    fallback = events["c2"].usage
    assert fallback is not None and fallback.summarizer == "extractive" and fallback.fallback
    assert events["c3"].usage is not None and events["c3"].usage.summarizer == "anthropic"
    assert sample(h.components.metrics, "compactor_tenant_budget_fallbacks_total") == 1
    assert "tenant acme has used its LLM budget" in caplog.text
    # The extractive summariser's tokens are no LLM's: the budget stays spent, not more so.
    start = datetime(1970, 1, 1, tzinfo=UTC)
    assert await h.store.usage.tenant_llm_tokens("acme", start) == 1_320 * llm_calls
    h.clock.now += 86_400  # the next day
    calls_before = model.calls
    await compact_once(h, "c4", "acme")
    assert model.calls > calls_before
    assert clip_events(h)[-1].usage.summarizer == "anthropic"  # type: ignore[union-attr]


async def test_the_clip_archive_event_carries_the_batch_s_specifics_ledger() -> None:
    h = harness(model=GistModel())
    await compact_once(h)
    (event,) = clip_events(h)
    ledger = [s for batch in event.batches for s in batch.specifics]
    texts = {s.text for s in ledger}
    assert {"ORD-55120", "/srv/a/b.toml"} <= texts
    assert all(s.message_id == "c1-m0001" for s in ledger if s.text == "ORD-55120")
    content = event.clip_archive.content
    assert "ORD-55120" in content and "- c1-m0001:" in content
    payload = json.loads(h.publisher.on("clip_archives")[0].value)
    assert payload["batches"][0]["specifics"][0]["message_id"]
