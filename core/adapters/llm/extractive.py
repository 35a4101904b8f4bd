"""The offline summariser as a model provider: extracts instead of generating.

Without an API key the service still has to keep conversations inside their
budget; this provider answers the same structured request the LLM adapters
get with ``core.domain.extractive.extract_summary``, so the pipeline is
identical. The extraction itself is pure and lives in the domain, where the
turn-time context fit uses it too.
"""

from __future__ import annotations

import asyncio

from core.domain.extractive import extract_summary
from core.domain.tokens import DEFAULT_COUNTER, TokenCounter
from core.ports.model import ModelRequest, ModelResponse, ModelUsage

__all__ = ["ExtractiveProvider", "extract_summary"]


class ExtractiveProvider:
    """The offline default when no API key is configured."""

    name = "extractive"

    def __init__(self, counter: TokenCounter = DEFAULT_COUNTER) -> None:
        self._counter = counter

    async def complete(self, request: ModelRequest) -> ModelResponse:
        # Its work grows with the request (bounded per message): not on the event loop.
        text, output_tokens = await asyncio.to_thread(extract_summary, request, self._counter)
        input_tokens = sum(self._counter.count(m.content) for m in request.messages)
        return ModelResponse(
            text=text,
            usage=ModelUsage(input_tokens=input_tokens, output_tokens=output_tokens),
            model="extractive",
            stop_reason="end_turn",
        )
