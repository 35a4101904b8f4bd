"""What the two in-process embedders share: a model loaded once, encoding off the loop.

Loading takes seconds, so it happens on first use (the service starts without
the model) and concurrent first requests share one load. Encoding is CPU work
of tens of milliseconds a batch: it runs in a worker thread so the event loop
keeps serving Kafka meanwhile. Failures of either become ``EmbeddingError``,
which the compactor treats as "no vectors this time", never as a failed
compaction.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import Generic, TypeVar

from core.ports.embedding import EmbeddingError

Encoder = TypeVar("Encoder")


class ThreadedEmbedder(ABC, Generic[Encoder]):
    """``Embedder`` over an encoder built by ``_load`` and used by ``_encode``."""

    model: str

    def __init__(self, *, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self._batch_size = batch_size
        self._encoder: Encoder | None = None
        self._load_lock = asyncio.Lock()

    @property
    @abstractmethod
    def source(self) -> str:
        """Where the model's files are, for the error of a failed load."""

    @abstractmethod
    def _load(self) -> Encoder:
        """Build the encoder (blocking; runs in a worker thread)."""

    @abstractmethod
    def _encode(self, encoder: Encoder, texts: list[str]) -> list[list[float]]:
        """Unit vectors for ``texts`` (blocking; runs in a worker thread)."""

    async def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        encoder = await self._loaded()
        try:
            return await asyncio.to_thread(self._encode, encoder, texts)
        except Exception as error:
            raise EmbeddingError(
                f"{self.model} failed to encode {len(texts)} texts: {error}"
            ) from error

    async def _loaded(self) -> Encoder:
        async with self._load_lock:
            if self._encoder is None:
                try:
                    self._encoder = await asyncio.to_thread(self._load)
                except Exception as error:
                    raise EmbeddingError(
                        f"could not load {self.model} from {self.source}: {error}"
                    ) from error
            return self._encoder
