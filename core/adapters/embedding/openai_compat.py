"""OpenAI-compatible ``/v1/embeddings`` adapter for the Embedder port.

Works against OpenAI and the local servers that copy its protocol (vLLM,
llama.cpp, Ollama, text-embeddings-inference), selected by ``base_url``.
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Mapping

import openai

from core.ports.embedding import EmbeddingError


class OpenAICompatEmbedder:
    """An ``Embedder`` over ``openai.AsyncOpenAI().embeddings``.

    Inputs are sent in batches of ``batch_size`` because servers cap the
    inputs per request (OpenAI at 2048, local servers often far lower) and a
    large ``memory_write`` should not fail for being large. Batches go out one
    after another, which keeps a small local server from being flooded.

    Unlike the chat adapters, the SDK's own retries stay on by default
    (``max_retries=2``): no caller above this port owns a retry policy for
    embeddings, and a transient 5xx should not cost a memory its vector.
    """

    def __init__(
        self,
        model: str,
        api_key: str,
        *,
        base_url: str | None = None,
        timeout_seconds: float = 30.0,
        batch_size: int = 64,
        max_retries: int = 2,
        default_headers: Mapping[str, str] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.model = model
        self.batch_size = batch_size
        self._client = openai.AsyncOpenAI(
            api_key=api_key,
            base_url=base_url,
            timeout=timeout_seconds,
            max_retries=max_retries,
            default_headers=default_headers,
        )

    async def aclose(self) -> None:
        """Release the pooled HTTP connections."""
        await self._client.close()

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """One vector per text, in input order, all of the same dimension."""
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            vectors.extend(await self._embed_batch(texts[start : start + self.batch_size]))
        if vectors and len({len(v) for v in vectors}) != 1:
            raise EmbeddingError(f"embedding model {self.model!r} returned mixed dimensions")
        return vectors

    async def _embed_batch(self, batch: list[str]) -> list[list[float]]:
        try:
            response = await self._client.embeddings.create(
                model=self.model,
                input=batch,
                # The SDK would ask for base64 by default; several compatible
                # servers only speak floats.
                encoding_format="float",
            )
        except openai.APITimeoutError as exc:
            raise EmbeddingError(f"embedding request to {self.model!r} timed out") from exc
        except openai.APIConnectionError as exc:
            raise EmbeddingError(
                f"could not reach embedding server for {self.model!r}: {exc.message}"
            ) from exc
        except openai.APIStatusError as exc:
            raise EmbeddingError(
                f"embedding request to {self.model!r} failed with HTTP {exc.status_code}: "
                f"{exc.message}"
            ) from exc
        except (openai.OpenAIError, ValueError) as exc:
            raise EmbeddingError(
                f"embedding request to {self.model!r} failed: {type(exc).__name__}: {exc}"
            ) from exc

        items = getattr(response, "data", None)
        if not isinstance(items, list) or len(items) != len(batch):
            got = len(items) if isinstance(items, list) else "no"
            raise EmbeddingError(f"embedding server returned {got} vectors for {len(batch)} inputs")
        try:
            ordered = sorted(items, key=lambda item: int(item.index))
            vectors = [_as_vector(item.embedding) for item in ordered]
        except (AttributeError, TypeError, ValueError, struct.error) as exc:
            raise EmbeddingError(f"malformed embedding response: {exc}") from exc
        if [int(item.index) for item in ordered] != list(range(len(batch))):
            raise EmbeddingError("embedding response indices do not match the inputs")
        return vectors


def _as_vector(raw: object) -> list[float]:
    """Floats as sent, or decoded from base64 for servers that ignore
    ``encoding_format`` and answer in the SDK's default format anyway."""
    if isinstance(raw, str):
        data = base64.b64decode(raw, validate=True)
        values = list(struct.unpack(f"<{len(data) // 4}f", data))
    elif isinstance(raw, list):
        values = [float(x) for x in raw]
    else:
        raise TypeError(f"embedding is a {type(raw).__name__}, not a vector")
    if not values or not all(math.isfinite(x) for x in values):
        raise ValueError("embedding is empty or has non-finite values")
    return values
