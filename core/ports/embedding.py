"""Embeddings for ``memory_read``'s vector half.

Optional: with no embedder, search is full-text only and says so.
"""

from __future__ import annotations

from typing import Protocol


class EmbeddingError(Exception):
    pass


class Embedder(Protocol):
    """``model`` names the embedding space; vectors from different models are
    never compared."""

    model: str

    async def embed(self, texts: list[str]) -> list[list[float]]: ...
