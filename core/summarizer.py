"""The compaction's LLM calls: fold-in summaries, re-summaries, and their retry policy.

Kept apart from the compactor's orchestration so that what is asked of the
model, how a failure is retried and what it cost are read in one place.
Every call goes through the worker's one ``ProviderGuard``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from core.domain.chunking import Chunk, halve, in_history_order
from core.domain.clip_archive import covered_days
from core.domain.compaction import (
    CompactionConfig,
    StoredBatch,
    SummaryBatch,
    batch_label,
    merged_batch,
)
from core.domain.prompts import build_resummarization_request, build_summarization_request
from core.ports.model import (
    ModelError,
    ModelProvider,
    ModelRateLimitError,
    ModelRequest,
    ModelResponse,
    ModelResponseError,
    ModelTimeoutError,
)
from core.provider_guard import ProviderGuard

log = logging.getLogger("compactor")


@dataclass
class LlmSpend:
    """One compaction's LLM spend, and how many answers the provider had given
    (to anyone) when this compaction's calls first failed."""

    input_tokens: int = 0
    output_tokens: int = 0
    answers_at_first_failure: int | None = None
    tenant: str | None = None  # whose turn for a guard slot these calls take


class Summarizer:
    """Summaries from the model, retried by one policy (``_retry_or_raise``)."""

    def __init__(
        self,
        *,
        model: ModelProvider,
        config: CompactionConfig,
        model_name: str,
        guard: ProviderGuard,
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self._model = model
        self._config = config
        self._model_name = model_name
        self._guard = guard
        self._sleep = sleep

    async def summarize_chunks(
        self,
        chunks: Sequence[Chunk],
        position: dict[str, int],
        prior: str | None,
        calls: LlmSpend,
    ) -> list[SummaryBatch]:
        """Fold-in: each chunk's request carries the summary so far (context-compaction.AC1.3).

        A timed-out chunk is split in halves that go to the front of the queue,
        so fold-in order is preserved.
        """
        out: list[SummaryBatch] = []
        running = prior
        pending: deque[tuple[Chunk, int]] = deque((chunk, 0) for chunk in chunks)
        while pending:
            chunk, attempt = pending.popleft()
            ordered = in_history_order(chunk, position)
            request = build_summarization_request(
                system_prompt=self._config.prompt,
                previous_summary=running,
                messages=ordered,
                model_name=self._model_name,
                max_tokens=self._config.max_summary_tokens,
            )
            try:
                text = await self._complete(request, calls)
            except ModelError as error:
                await self._retry_or_raise(error, attempt)
                if isinstance(error, ModelTimeoutError):
                    pending.extendleft(reversed([(half, attempt + 1) for half in halve(ordered)]))
                else:
                    pending.appendleft((ordered, attempt + 1))
                continue
            out.append(
                SummaryBatch(
                    content=text,
                    depth=0,
                    start_time=min(m.created_at for m in ordered),
                    end_time=max(m.created_at for m in ordered),
                    message_count=len(ordered),
                    source_message_ids=tuple(m.id for m in ordered),
                    days=covered_days(m.created_at for m in ordered),
                )
            )
            running = text
        return out

    async def resummarize(
        self,
        sources: Sequence[StoredBatch],
        conversation_id: str,
        compaction_id: str,
        calls: LlmSpend,
        *,
        suffix: str,
        max_tokens: int | None = None,
    ) -> StoredBatch:
        request = build_resummarization_request(
            system_prompt=self._config.prompt,
            batch_contents=[s.batch.content for s in sources],
            model_name=self._model_name,
            max_tokens=max_tokens or self._config.max_summary_tokens,
        )
        attempt = 0
        while True:
            try:
                text = await self._complete(request, calls)
                break
            except ModelError as error:
                await self._retry_or_raise(error, attempt)
                attempt += 1
        merged = merged_batch(sources, text)
        return StoredBatch(
            id=f"{compaction_id}:{suffix}",
            label=batch_label(conversation_id, merged.end_time),
            conversation_id=conversation_id,
            batch=merged,
            compaction_id=compaction_id,
        )

    async def _complete(self, request: ModelRequest, calls: LlmSpend) -> str:
        guard = self._guard
        try:
            response = await guard.call(lambda: self._call_model(request), tenant=calls.tenant)
        except ModelError:
            if calls.answers_at_first_failure is None:
                calls.answers_at_first_failure = guard.successes
            raise
        calls.input_tokens += response.usage.input_tokens
        calls.output_tokens += response.usage.output_tokens
        text = response.text.strip()
        if not text:
            raise ModelResponseError(
                "the model returned an empty summary", provider=self._model.name
            )
        return text

    async def _call_model(self, request: ModelRequest) -> ModelResponse:
        try:
            return await asyncio.wait_for(
                self._model.complete(request), timeout=self._config.timeout_seconds
            )
        except TimeoutError as error:
            raise ModelTimeoutError(
                f"no answer within {self._config.timeout_seconds}s", provider=self._model.name
            ) from error

    async def _retry_or_raise(self, error: ModelError, attempt: int) -> None:
        """The retry policy for every LLM call, so the two loops cannot drift:
        re-raise ``error`` when trying again cannot help or ``attempt`` (0 for
        the first call) has used up ``max_retries``, otherwise wait before the
        caller retries. What to retry with stays with the caller, since only
        the chunk loop can answer a timeout with a smaller request.

        The wait doubles per attempt, but never undercuts a rate limit's
        ``retry_after``: asking again sooner than the server said would only
        earn another 429. A ``retry_after`` longer than the provider guard
        would let any call wait gives up at once instead: the guard refuses
        every call until then anyway, and reconciliation retries later.
        """
        if not error.retryable or attempt >= self._config.max_retries:
            raise error
        delay = self._config.retry_backoff_seconds * 2**attempt
        if isinstance(error, ModelRateLimitError) and error.retry_after is not None:
            if error.retry_after > self._guard.limits.max_wait_seconds:
                raise error
            delay = max(delay, error.retry_after)
        log.info("retrying LLM call in %.2fs after %s", delay, type(error).__name__)
        await self._sleep(delay)
