"""The vectors of what a compaction archives, made before it is written.

A slow or failing embedding service must neither hold the compaction's
transaction open nor fail the compaction: it only costs the vector half of
search for those batches and turns, which stay findable by full text. So a
failure is a warning and the plan goes without vectors.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from core.domain.clip_archive import is_clip_archive
from core.domain.compaction import CompactionPlan, PlanEmbeddings
from core.domain.messages import ConversationMessage
from core.domain.vectors import check_vectors
from core.ports.embedding import Embedder

log = logging.getLogger(__name__)


async def with_embeddings(
    embedder: Embedder | None, plan: CompactionPlan, history: Sequence[ConversationMessage]
) -> CompactionPlan:
    """``plan`` with the vectors of its new batches and of the raw turns it
    compresses (their text from ``history``, the history it was planned from);
    as it is when there is no embedder, nothing to embed, or the batches'
    embedding failed (turns are stored with vectors only beside batches that
    have them)."""
    if embedder is None or not plan.new_batches:
        return plan
    texts = [b.batch.content for b in plan.new_batches]
    batches = await _embedded(embedder, texts, f"{len(texts)} batches with {embedder.model}")
    deleted = set(plan.deleted_message_ids)
    turns = sorted(
        (m for m in history if m.id in deleted and not is_clip_archive(m)), key=lambda m: m.id
    )
    vectors = await _embedded(embedder, [m.content for m in turns], f"{len(turns)} archived turns")
    if batches is None:
        return plan
    by_turn = {} if vectors is None else dict(zip((m.id for m in turns), vectors, strict=True))
    embeddings = PlanEmbeddings(model=embedder.model, batches=tuple(batches), turns=by_turn)
    return plan.model_copy(update={"embeddings": embeddings})


async def _embedded(embedder: Embedder, texts: list[str], what: str) -> list[list[float]] | None:
    if not texts:
        return None
    try:
        vectors = await embedder.embed(texts)
        check_vectors(vectors, len(texts))
    except Exception as error:
        # Archiving matters more than the vector index.
        log.warning("embedding %s failed, storing them without embeddings: %s", what, error)
        return None
    return vectors
