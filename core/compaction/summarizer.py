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
from functools import partial

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_random_exponential

from core.compaction.calibration import Calibration
from core.compaction.offload import Offload, ThreadOffload
from core.compaction.spend import LlmSpend
from core.domain.chunking import Chunk, halve, in_history_order
from core.domain.clip_archive import batch_label, covered_days
from core.domain.compaction import CompactionConfig, StoredBatch, SummaryBatch, merged_batch
from core.domain.messages import ConversationMessage
from core.domain.prompts import (
    build_resummarization_request,
    build_summarization_request,
    instructions,
)
from core.domain.scoring import score_message
from core.domain.specifics import (
    Ledger,
    Specific,
    apply_ledger,
    merge_ranked,
    rank_specifics,
    split_section,
)
from core.domain.tokens import DEFAULT_COUNTER, TokenCounter
from core.ports.model import (
    ModelEmptyResponse,
    ModelError,
    ModelProvider,
    ModelRateLimitError,
    ModelRequest,
    ModelResponse,
    ModelTimeoutError,
)
from core.provider_guard import ProviderGuard

log = logging.getLogger("compactor")

CUT_AT_MAX_TOKENS = frozenset({"max_tokens", "length"})
"""Stop reasons of an answer cut at ``max_tokens`` (Anthropic's, OpenAI's)."""


class _Halve(Exception):
    """A timed-out chunk goes again as two halves, after ``used`` attempts."""

    def __init__(self, used: int) -> None:
        super().__init__(f"halve after {used} attempts")
        self.used = used


class Summarizer:
    """Summaries from the model, retried by one policy (``_retrying``), each
    with its specifics ledger (``core.domain.specifics``), whichever model wrote it.

    ``guard`` None: the model is local (the extractive fallback), its calls
    neither take a provider slot nor wait out a provider's outage.
    ``calibration``: what each call's reported input tokens are measured into
    (the deployment's model; none for the fallback). ``offload`` runs what reads
    every turn's text (the turns' importance, the ledger) off the event loop.
    """

    def __init__(
        self,
        *,
        model: ModelProvider,
        config: CompactionConfig,
        model_name: str,
        guard: ProviderGuard | None,
        sleep: Callable[[float], Awaitable[None]],
        counter: TokenCounter = DEFAULT_COUNTER,
        calibration: Calibration | None = None,
        offload: Offload | None = None,
    ) -> None:
        self._model = model
        self._offload = offload or ThreadOffload()
        self._config = config
        self._model_name = model_name
        self._guard = guard
        self._sleep = sleep
        self._counter = counter
        self._calibration = calibration

    @property
    def provider(self) -> str:
        return self._model.name

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def instructions(self) -> tuple[str, ...]:
        """The system prompt and directive of its requests (configured per deployment)."""
        return instructions(self._config.prompt)

    def _allowances(self, max_tokens: int, *, within: bool) -> tuple[int, int]:
        """(the model's max_tokens, the ledger's allowance). ``within``: both must
        share ``max_tokens`` (a batch fitted to the room left); otherwise the
        ledger comes on top of a summary of ``max_tokens``."""
        ratio = self._config.specifics_ratio
        if within:
            ledger = int(max_tokens * ratio / (1 + ratio))
            return max(1, max_tokens - ledger), ledger
        return max_tokens, int(max_tokens * ratio)

    def _ledger(self, text: str, ranked: Sequence[Specific], allowance: int) -> Ledger:
        return apply_ledger(text, ranked, allowance, self._counter.count)

    def _sources_ledger(
        self,
        text: str,
        sources: Sequence[ConversationMessage],
        importance: dict[str, float],
        allowance: int,
    ) -> Ledger:
        """The ledger of a summary of ``sources``: one step, run off the loop (its
        cost grows with the sources' text, bounded per turn by ``rank_specifics``)."""
        return self._ledger(text, rank_specifics(sources, importance), allowance)

    async def summarize_chunks(
        self,
        chunks: Sequence[Chunk],
        position: dict[str, int],
        prior: str | None,
        calls: LlmSpend,
    ) -> list[SummaryBatch]:
        """Fold-in: each chunk's request carries the summary so far (context-compaction.AC1.3).

        A timed-out chunk is split in halves that go to the front of the queue,
        so fold-in order is preserved; they go on counting its attempts.
        """
        out: list[SummaryBatch] = []
        running = prior
        pending: deque[tuple[Chunk, int]] = deque((chunk, 0) for chunk in chunks)
        max_tokens, allowance = self._allowances(self._config.max_summary_tokens, within=False)
        importance = await self._offload(lambda: self._importance(position, chunks))
        while pending:
            chunk, used = pending.popleft()
            ordered = in_history_order(chunk, position)
            request = build_summarization_request(
                system_prompt=self._config.prompt,
                previous_summary=running,
                messages=ordered,
                model_name=self._model_name,
                max_tokens=max_tokens,
            )
            try:
                text = await self._ask(request, calls, used, halvable=len(halve(ordered)) > 1)
            except _Halve as halved:
                pending.extendleft(reversed([(half, halved.used) for half in halve(ordered)]))
                continue
            ledger = await self._offload(
                partial(self._sources_ledger, text, ordered, importance, allowance)
            )
            out.append(_summary_batch(ordered, ledger))
            running = text  # the summary alone: the next chunk's model needs no ledger
        return out

    def _importance(self, position: dict[str, int], chunks: Sequence[Chunk]) -> dict[str, float]:
        """Each compressed turn's importance score (what the split ranked it by),
        one of the ledger's ranking signals."""
        total = max(position.values(), default=-1) + 1
        scoring = self._config.scoring
        messages: list[ConversationMessage] = [m for chunk in chunks for m in chunk]
        return {m.id: score_message(m, position[m.id], total, scoring) for m in messages}

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
        """``sources`` as one batch; its ledger carries forward the most important
        specifics the sources remembered that the new summary dropped. The
        model sees the sources' summaries without their ledger sections: the
        ledger, not the model, is what keeps them."""
        limit, allowance = self._allowances(
            max_tokens or self._config.max_summary_tokens, within=max_tokens is not None
        )
        request = build_resummarization_request(
            system_prompt=self._config.prompt,
            batch_contents=[split_section(s.batch.content)[0] for s in sources],
            model_name=self._model_name,
            max_tokens=limit,
        )
        text = await self._ask(request, calls)
        ranked = merge_ranked(s.batch.specifics for s in sources)
        ledger = self._ledger(text, ranked, allowance)
        merged = merged_batch(sources, ledger.content).model_copy(
            update={"specifics": ledger.remembered, "ledger": ledger.shown}
        )
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
            if guard is None:
                response = await self._call_model(request)
            else:
                response = await guard.call(lambda: self._call_model(request), tenant=calls.tenant)
        except ModelEmptyResponse as empty:
            # An answer all the same, billed: an empty summary, which the gate refuses.
            response = ModelResponse(text="", usage=empty.usage)
        except ModelError:
            if calls.answers_at_first_failure is None and guard is not None:
                calls.answers_at_first_failure = guard.successes
            raise
        usage = response.usage
        calls.calls += 1
        calls.input_tokens += usage.input_tokens
        calls.output_tokens += usage.output_tokens
        calls.cache_read_tokens += usage.cache_read_tokens
        calls.cache_write_tokens += usage.cache_write_tokens
        calls.summarizer = self._model.name
        calls.model = self._model_name
        if self._calibration is not None:
            await self._calibration.measured(request, usage)
        if response.stop_reason in CUT_AT_MAX_TOKENS:
            calls.cut_off += 1
        # Empty or not, the gate judges it (``core.domain.gate``: ``empty_summary``),
        # and a refused compaction falls back to the extractive summariser.
        return response.text.strip()

    async def _call_model(self, request: ModelRequest) -> ModelResponse:
        try:
            return await asyncio.wait_for(
                self._model.complete(request), timeout=self._config.timeout_seconds
            )
        except TimeoutError as error:
            raise ModelTimeoutError(
                f"no answer within {self._config.timeout_seconds}s", provider=self._model.name
            ) from error

    async def _ask(
        self, request: ModelRequest, calls: LlmSpend, used: int = 0, *, halvable: bool = False
    ) -> str:
        """The model's answer to ``request``, retried by ``_retrying``. ``halvable``: a
        timeout is answered with a smaller request, which only the chunk loop can
        make: after the wait, ``_Halve`` hands it the attempts used so far."""
        timed_out = False
        async for attempt in self._retrying(used):
            with attempt:
                if timed_out:
                    raise _Halve(used + attempt.retry_state.attempt_number - 1)
                try:
                    return await self._complete(request, calls)
                except ModelTimeoutError:
                    timed_out = halvable
                    raise
        raise AssertionError("unreachable: the retrying loop returns or raises")

    def _retrying(self, used: int) -> AsyncRetrying:
        """The retry policy for every LLM call, so the two loops cannot drift: give
        up when trying again cannot help or ``max_retries`` are used up (``used``
        of them before this request: a halved chunk's), else wait and try again.

        The wait is drawn at random up to ``retry_backoff_seconds × 2^attempt``
        (full jitter: the compactions that failed together do not come back
        together), but never undercuts a rate limit's ``retry_after``: asking
        again sooner than the server said would only earn another 429. A
        ``retry_after`` longer than the provider guard lets any call wait gives up
        at once instead: the guard refuses every call until then anyway, and
        reconciliation retries later.
        """
        backoff = wait_random_exponential(
            multiplier=self._config.retry_backoff_seconds * 2**used, min=0
        )

        def wait(state: RetryCallState) -> float:
            error = state.outcome.exception() if state.outcome is not None else None
            delay = backoff(state)
            if isinstance(error, ModelRateLimitError) and error.retry_after is not None:
                delay = max(delay, error.retry_after)
            return delay

        return AsyncRetrying(
            sleep=self._sleep,
            stop=stop_after_attempt(self._config.max_retries + 1 - used),
            retry=retry_if_exception(self._may_retry),
            wait=wait,
            before_sleep=_log_retry,
            reraise=True,
        )

    def _may_retry(self, error: BaseException) -> bool:
        if not isinstance(error, ModelError) or not error.retryable:
            return False
        if isinstance(error, ModelRateLimitError) and error.retry_after is not None:
            guard = self._guard
            return guard is None or error.retry_after <= guard.limits.max_wait_seconds
        return True


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome is not None else None
    delay = state.next_action.sleep if state.next_action is not None else 0.0
    log.info("retrying LLM call in %.2fs after %s", delay, type(error).__name__)


def _summary_batch(ordered: Sequence[ConversationMessage], ledger: Ledger) -> SummaryBatch:
    return SummaryBatch(
        content=ledger.content,
        depth=0,
        start_time=min(m.created_at for m in ordered),
        end_time=max(m.created_at for m in ordered),
        message_count=len(ordered),
        source_message_ids=tuple(m.id for m in ordered),
        days=covered_days(m.created_at for m in ordered),
        specifics=ledger.remembered,
        ledger=ledger.shown,
    )
