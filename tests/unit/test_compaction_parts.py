"""The compaction package's parts on their own: failure kinds, the restore's
clip-archive estimate, the summariser's retry waits, and the plan's vectors.

Why: each part has one job and its own rule (a metric label from a kind, never
from a message; a restore's summary counted in full; full-jitter waits that
still honour a 429; an embedding failure that costs vectors, not the
compaction); they are checked where they are written.
"""

from __future__ import annotations

import logging
import random
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.compaction.attempt import failure_kind
from core.compaction.batches import CompactionIds
from core.compaction.embedding import with_embeddings
from core.compaction.fitting import ClipFitter
from core.compaction.spend import LlmSpend
from core.compaction.summarizer import Summarizer
from core.domain.compaction import (
    CompactionConfig,
    CompactionPlan,
    StoredBatch,
    SummaryBatch,
)
from core.domain.tokens import DEFAULT_COUNTER, estimate_history_tokens
from core.ports.model import (
    ModelAuthError,
    ModelError,
    ModelRateLimitError,
    ModelRequest,
    ModelResponse,
    ModelResponseError,
    ModelServerError,
    ModelTimeoutError,
)
from core.ports.storage import HistoryConflictError, StoreRejected, StoreUnavailable
from core.provider_guard import ProviderUnavailableError
from tests.support.builders import T0, history, message

pytestmark = pytest.mark.unit

IDS = CompactionIds("conv-1", "cmp-1")


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (ProviderUnavailableError("open", 5.0), "provider_unavailable"),
        (ModelRateLimitError("429", retry_after=3), "rate_limited"),
        (ModelAuthError("bad key"), "model_auth"),
        (ModelTimeoutError("slow"), "model_timeout"),
        (ModelServerError("HTTP 503: busy", status=503), "model_server"),
        (ModelResponseError("empty"), "model_response"),
        (ModelError("other"), "model_error"),
        (HistoryConflictError("gone"), "history_conflict"),
        (StoreUnavailable("down"), "store_unavailable"),
        (StoreRejected("bad text"), "error"),
        (RuntimeError("boom: with a colon"), "error"),
    ],
)
def test_a_failure_is_labelled_by_its_kind_not_its_message(error: Exception, kind: str) -> None:
    assert failure_kind(error) == kind


def batch(index: int, content: str, *, source: int = 1) -> StoredBatch:
    moment = T0 + timedelta(minutes=index)
    return StoredBatch(
        id=f"b{index}",
        label=f"label-{index}",
        conversation_id=IDS.conversation_id,
        batch=SummaryBatch(
            content=content, depth=0, start_time=moment, end_time=moment, message_count=source
        ),
        compaction_id="old",
    )


STORABLE = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")


@given(
    summary=st.text(alphabet=STORABLE, max_size=400),
    others=st.lists(st.text(alphabet=STORABLE, max_size=80), max_size=5),
)
def test_the_clip_archive_estimate_is_subadditive(summary: str, others: list[str]) -> None:
    """What ``fitting_turns`` relies on: the clip-archive with a summary is never
    counted above the clip-archive with that summary empty plus the summary."""
    fitter = ClipFitter(CompactionConfig(), DEFAULT_COUNTER, 1000)
    rest = [batch(i, text) for i, text in enumerate(others)]
    chosen = batch(99, "")
    empty = fitter.clip([*(b.batch for b in rest), chosen.batch], IDS, 1)
    filled = chosen.batch.model_copy(update={"content": summary})
    full = fitter.clip([*(b.batch for b in rest), filled], IDS, 1)
    assert fitter.tokens(full) <= fitter.tokens(empty) + DEFAULT_COUNTER.count(summary)


def test_a_restore_counts_the_summary_of_the_turns_left_at_its_full_allowance() -> None:
    """Not at half of it, as an allowance sized by ``"x " * allowance`` was: with one
    token less than a summary of the other turns needs beside the newest two,
    only the newest one comes back."""
    turns = tuple(message(i, "user" if i % 2 == 0 else "assistant", "x" * 400) for i in range(6))
    config = CompactionConfig(max_summary_tokens=5)
    chosen = batch(0, "the batch's summary", source=6)
    empty = ClipFitter(config, DEFAULT_COUNTER, None).clip(
        [chosen.batch.model_copy(update={"content": ""})], IDS, 1
    )
    # The newest two beside the clip-archive with a summary of 5 tokens of the rest.
    target = DEFAULT_COUNTER.count(empty.content) + 5 + estimate_history_tokens(turns[4:])
    fits = ClipFitter(config, DEFAULT_COUNTER, target).fitting_turns(turns, 0, [], chosen, IDS)
    assert fits == (turns[4:], turns[:4])
    fewer = ClipFitter(config, DEFAULT_COUNTER, target - 1).fitting_turns(turns, 0, [], chosen, IDS)
    assert fewer == (turns[5:], turns[:5])


class Scripted:
    """Fails with ``errors`` in turn, then answers."""

    name = "scripted"

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        if self.errors:
            raise self.errors.pop(0)
        return ModelResponse(text="a summary of what was said")


def summarizer(model: Any, slept: list[float], **config: Any) -> Summarizer:
    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    tuning = CompactionConfig(**{"retry_backoff_seconds": 1.0, "max_retries": 3, **config})
    return Summarizer(model=model, config=tuning, model_name="m", guard=None, sleep=sleep)


async def test_retries_wait_a_random_time_in_a_doubling_window_never_under_retry_after() -> None:
    random.seed(7)
    slept: list[float] = []
    model = Scripted(
        ModelServerError("HTTP 503", status=503),
        ModelRateLimitError("429", retry_after=5.0),
        ModelServerError("HTTP 502", status=502),
    )
    chunk = tuple(history(2))
    position = {m.id: i for i, m in enumerate(chunk)}
    (done,) = await summarizer(model, slept).summarize_chunks([chunk], position, None, LlmSpend())
    assert done.source_message_ids == tuple(m.id for m in chunk)
    first, second, third = slept
    # Drawn in [0, 1 × 2^attempt) (a fixed doubling would wait 1.0, then 4.0).
    assert 0 <= first < 1.0 and second == 5.0 and 0 <= third < 4.0


async def test_a_timed_out_chunk_is_halved_and_its_halves_go_on_counting_attempts() -> None:
    slept: list[float] = []
    model = Scripted(ModelTimeoutError("slow"), ModelTimeoutError("slow"), ModelTimeoutError("x"))
    chunk = tuple(history(8))
    position = {m.id: i for i, m in enumerate(chunk)}
    with pytest.raises(ModelTimeoutError):
        await summarizer(model, slept, max_retries=2).summarize_chunks(
            [chunk], position, None, LlmSpend()
        )
    # 8 messages, then the first half (4), then its first half (2): three attempts
    # in all, the last one over max_retries, so it is not waited for.
    assert [len(r.messages) - 1 for r in model.requests] == [8, 4, 2]
    assert len(slept) == 2


def plan_of(turns: list[Any]) -> CompactionPlan:
    return CompactionPlan(
        compaction_id=IDS.compaction_id,
        conversation_id=IDS.conversation_id,
        new_batches=(batch(1, "summary one"), batch(2, "summary two")),
        deleted_message_ids=tuple(m.id for m in turns),
        clip_archive=None,
        messages_compressed=len(turns),
        tokens_estimate_before=0,
        tokens_estimate_after=0,
    )


class Recording:
    model = "toy-v1"

    def __init__(self, fail_on: int | None = None) -> None:
        self.asked: list[list[str]] = []
        self.fail_on = fail_on

    async def embed(self, texts: list[str]) -> list[list[float]]:
        self.asked.append(texts)
        if self.fail_on == len(self.asked):
            raise RuntimeError("embedding service down")
        return [[float(len(text)), 1.0] for text in texts]


async def test_the_plan_carries_vectors_of_its_batches_and_of_the_turns_from_the_history() -> None:
    turns = history(3)
    clip = turns[0].model_copy(update={"id": "clip-archive-old", "role": "system"})
    found = [clip.as_clip_archive(), *turns, *history(2, start=10)]
    embedder = Recording()
    plan = await with_embeddings(embedder, plan_of([clip, *turns]), found)
    assert plan.embeddings is not None and plan.embeddings.model == "toy-v1"
    assert plan.embeddings.batches == ([11.0, 1.0], [11.0, 1.0])
    assert set(plan.embeddings.turns) == {m.id for m in turns}  # no clip-archive
    assert embedder.asked[1] == [m.content for m in sorted(turns, key=lambda m: m.id)]


@pytest.mark.parametrize("fail_on", [1, 2])
async def test_an_embedding_failure_only_costs_vectors(
    fail_on: int, caplog: pytest.LogCaptureFixture
) -> None:
    turns = history(3)
    with caplog.at_level(logging.WARNING):
        plan = await with_embeddings(Recording(fail_on=fail_on), plan_of(turns), turns)
    assert any("embedding" in r.getMessage() for r in caplog.records)
    if fail_on == 1:  # the batches': no vectors at all (turns only beside batches)
        assert plan.embeddings is None
    else:  # the turns': the batches keep theirs
        assert plan.embeddings is not None and plan.embeddings.turns == {}
    assert plan.model_copy(update={"embeddings": None}) == plan_of(turns)


async def test_without_an_embedder_the_plan_is_as_planned() -> None:
    turns = history(2)
    assert await with_embeddings(None, plan_of(turns), turns) == plan_of(turns)
