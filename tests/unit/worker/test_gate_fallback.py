"""A compaction the gate refuses is not applied; the conversation falls back to the
extractive summariser, and the refusal is counted, recorded and published."""

from __future__ import annotations

import json

import pytest

from core.domain.compaction import Failed
from core.ports.model import ModelRequest, ModelResponse, ModelUsage
from streams.worker.processor import Compacted
from tests.support.metrics_text import sample
from tests.unit.worker.harness import harness, over_budget

pytestmark = pytest.mark.unit


class EchoingModel:
    """Answers with its input, fence markers included: what a small real model
    did with our request (docs/memory.md, "The gate")."""

    name = "echoing"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        echoed = "\n".join(m.content for m in request.messages[:-1])
        return ModelResponse(text=echoed, usage=ModelUsage(input_tokens=10, output_tokens=10))


async def test_an_echoed_summary_is_rejected_and_the_extractive_fallback_applied() -> None:
    h = harness(model=EchoingModel())
    command = await over_budget(h)
    before = dict(h.store.messages)
    outcome = await h.components.processor.compact(command)
    assert isinstance(outcome, Compacted)
    assert outcome.plan.usage.summarizer == "extractive"
    assert len(h.store.messages) != len(before)  # the fallback took effect
    published = [json.loads(p.value) for p in h.publisher.on("clip_archives")]
    rejected = [e for e in published if e.get("type") == "compaction_rejected"]
    assert [(e["reason"], e["summarizer"], e["fallback"]) for e in rejected] == [
        ("echo", "echoing", "extractive")
    ]
    assert rejected[0]["compaction_id"] == command.compaction_id
    clip_events = [e for e in published if "type" not in e]
    assert len(clip_events) == 1 and clip_events[0]["usage"]["summarizer"] == "extractive"
    metrics = h.components.metrics
    labels = {"reason": "echo", "summarizer": "echoing"}
    assert sample(metrics, "compactor_compactions_rejected_total", **labels) == 1
    (recorded,) = await h.store.compactions.rejections("c1")
    assert (recorded.compaction_id, recorded.reason) == (command.compaction_id, "echo")


async def test_a_refused_fallback_fails_the_command_and_leaves_the_history_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing cheaper than the extractive summariser is left: no loop, one failure."""
    h = harness(model=EchoingModel())
    command = await over_budget(h)
    before = {key: row.message for key, row in h.store.messages.items()}
    monkeypatch.setattr("core.domain.gate.ECHO_SHARE", -1.0)  # every summary an echo
    monkeypatch.setattr("core.domain.gate.EXTRACTIVE", "none")  # the digest too
    outcome = await h.components.processor.compact(command)
    assert isinstance(outcome, Failed) and outcome.kind == "gate_rejected"
    assert {key: row.message for key, row in h.store.messages.items()} == before
    assert not h.completions()
    refused = await h.store.compactions.rejections("c1")
    assert sorted(r.summarizer for r in refused) == ["echoing", "extractive"]
    assert (
        sample(h.components.metrics, "compactor_compactions_failed_total", reason="gate_rejected")
        == 1
    )
