"""[budget].token_estimate = "calibrated" (issue 28): the summariser's calls measure
the provider's tokens per character, and messages ingested after that are counted
and stored at it; the table and the store agree, and the clip-archive is stored
with the count the compaction announced."""

from __future__ import annotations

import math

import pytest

from core.domain.calibration import request_chars
from core.ports.model import ModelRequest, ModelResponse, ModelUsage
from core.ports.storage import StoreUnavailable
from tests.support.llm_server import model_turn_words
from tests.unit.worker.harness import harness, words
from tests.unit.worker.test_usage_and_budgets import clip_events, compact_once

pytestmark = pytest.mark.unit

RATE = 0.4  # tokens a character, well above the estimate's 0.25


class CountingModel:
    """An LLM whose provider counts ``RATE`` tokens a character of each request."""

    name = "anthropic"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        return ModelResponse(
            text=f"They agreed on the order ({model_turn_words(request)}).",
            usage=ModelUsage(
                input_tokens=math.ceil(request_chars(request) * RATE), output_tokens=6
            ),
        )


def stored(h, conversation: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {m: row.tokens for (c, m), row in h.store.messages.items() if c == conversation}


async def test_messages_after_a_measured_call_are_counted_at_the_providers_rate() -> None:
    h = harness(model=CountingModel(), calibrated=True)
    assert h.calibration is not None
    await h.message(0, words(40, "early-"), "early")
    (early,) = stored(h, "early").values()
    assert early == math.ceil(len(words(40, "early-")) / 4)  # nothing measured yet

    await compact_once(h, "c1")
    assert 0.25 < h.calibration.rate.per_char < RATE  # one call moved it part of the way
    for n in range(2, 9):
        await compact_once(h, f"c{n}")
    rate = h.calibration.rate
    assert rate.per_char == pytest.approx(RATE, abs=0.04)  # the next ones most of the rest
    assert h.store.token_rates[("anthropic", "test")] == rate  # saved: a restart keeps it

    text = words(40, "late-")
    await h.message(0, text, "late")
    (late,) = stored(h, "late").values()
    assert late == math.ceil(len(text) * rate.per_char) > math.ceil(len(text) / 4)
    assert stored(h, "early") == {"early-m0000": early}  # counted once, never again
    for conversation in ("early", "late"):
        assert h.tally(conversation).token_total == sum(stored(h, conversation).values())


async def test_the_clip_archive_is_stored_with_the_count_its_completion_announced() -> None:
    h = harness(model=CountingModel(), calibrated=True)
    await compact_once(h, "c1")
    await compact_once(h, "c2")  # its plan is made at the measured rate
    clip = clip_events(h)[-1].clip_archive
    (completion,) = [c for c in h.completions() if c.conversation_id == "c2"]
    tokens = stored(h, "c2")[clip.id]
    assert tokens == math.ceil(len(clip.content) * h.calibration.rate.per_char)  # type: ignore[union-attr]
    assert tokens != math.ceil(len(clip.content) / 4)
    assert completion.tokens_added == tokens
    await h.control(completion)
    assert h.tally("c2").token_total == sum(stored(h, "c2").values())


async def test_the_extractive_fallback_is_not_measured() -> None:
    """A tenant past its LLM budget is summarised extractively: its counts are this
    very estimate, so they must not move the rate."""
    h = harness(
        model=CountingModel(), tenants=[{"id": "acme", "llm_tokens_per_day": 10}], calibrated=True
    )
    await compact_once(h, "c1", "acme")
    assert h.calibration is not None
    after_llm = h.calibration.rate
    await compact_once(h, "c2", "acme")  # the budget is spent: extractive
    assert clip_events(h)[-1].usage.summarizer == "extractive"  # type: ignore[union-attr]
    assert h.calibration.rate is after_llm


async def test_a_store_outage_keeps_the_rate_in_memory_and_the_compaction_goes_on() -> None:
    h = harness(model=CountingModel(), calibrated=True)
    h.store.outage["save_token_rate"] = 1000
    await compact_once(h, "c1")
    assert h.calibration is not None and h.calibration.rate.measured >= 1
    assert ("anthropic", "test") not in h.store.token_rates
    h.store.outage.clear()
    await compact_once(h, "c2")
    assert h.store.token_rates[("anthropic", "test")] == h.calibration.rate


async def test_without_calibration_nothing_is_measured() -> None:
    h = harness(model=CountingModel())
    await compact_once(h, "c1")
    text = words(40, "late-")
    await h.message(0, text, "late")
    assert stored(h, "late") == {"late-m0000": math.ceil(len(text) / 4)}
    assert h.store.token_rates == {}
    assert StoreUnavailable  # the port's outage error is what the harness raises
