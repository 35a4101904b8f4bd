"""The compaction pipeline (imperative shell).

split → chunk → fold-in summarise → re-summarise if too many batches →
one atomic store write → the new history ``[clip_archive, *kept]``.

Every LLM call happens before the first write. If any of them fails, nothing
is written and the caller gets its history back untouched with
``failed=True`` (context-compaction.AC1.7). The write itself is one
transaction keyed by the compaction id, so a retried compaction is a no-op.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from core.chunking import Chunk, chunk_messages, halve, in_history_order
from core.circuit import CircuitBreaker
from core.clip_archive import (
    ClipArchiveFormatError,
    build_clip_archive,
    clip_archive_message,
    parse_clip_archive,
)
from core.compaction import (
    CompactionConfig,
    CompactionPlan,
    CompactionResult,
    OutboxFactory,
    StoredBatch,
    SummaryBatch,
    batch_label,
)
from core.messages import ConversationMessage
from core.model.port import (
    ModelError,
    ModelProvider,
    ModelRateLimitError,
    ModelRequest,
    ModelResponseError,
    ModelTimeoutError,
)
from core.prompts import build_resummarization_request, build_summarization_request
from core.split import HistorySplit, split_history
from core.storage.ports import HistoryConflictError, MemoryStore, MessageStore
from core.tokens import DEFAULT_COUNTER, TokenCounter, estimate_history_tokens

log = logging.getLogger("compactor")

_COMPACTION_NAMESPACE = uuid.UUID("6f1c0d52-9a57-4c1e-8f2b-7f0e0c7a3d11")


def derive_compaction_id(conversation_id: str, history: Sequence[ConversationMessage]) -> str:
    """Same conversation, same history → same id, so a repeated call is recognised."""
    key = conversation_id + "\n" + "\n".join(message.id for message in history)
    return str(uuid.uuid5(_COMPACTION_NAMESPACE, key))


@dataclass
class _Usage:
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass
class _Summaries:
    batches: list[SummaryBatch] = field(default_factory=list)
    usage: _Usage = field(default_factory=_Usage)


class _Unchanged:
    """Results that hand the caller its history back as it was."""

    def __init__(
        self, history: tuple[ConversationMessage, ...], compaction_id: str, counter: TokenCounter
    ) -> None:
        self._history = history
        self._compaction_id = compaction_id
        self._tokens = estimate_history_tokens(history, counter)

    def __call__(
        self, reason: str, *, failed: bool, already_applied: bool = False
    ) -> CompactionResult:
        return CompactionResult(
            history=self._history,
            tokens_estimate_before=self._tokens,
            tokens_estimate_after=self._tokens,
            failed=failed,
            reason=reason,
            compaction_id=self._compaction_id,
            already_applied=already_applied,
        )

    def already_applied(self) -> CompactionResult:
        return self("compaction already applied", failed=False, already_applied=True)


class PipelineCompactor:
    """The seeds' pipeline behind the ``Compactor`` port; build it with ``create_compactor``."""

    def __init__(
        self,
        *,
        model: ModelProvider,
        messages_store: MessageStore,
        memory_store: MemoryStore,
        config: CompactionConfig,
        model_name: str,
        counter: TokenCounter,
        breaker: CircuitBreaker,
        sleep: Callable[[float], Awaitable[None]],
        outbox: OutboxFactory | None,
    ) -> None:
        self._outbox = outbox
        self._model = model
        self._messages = messages_store
        self._memory = memory_store
        self._config = config
        self._model_name = model_name
        self._counter = counter
        self._sleep = sleep
        self.breaker = breaker

    async def compress(
        self,
        history: tuple[ConversationMessage, ...] | list[ConversationMessage],
        conversation_id: str,
        *,
        compaction_id: str | None = None,
        outbox: OutboxFactory | None = None,
        check_applied: bool = True,
    ) -> CompactionResult:
        """Compact ``history``; ``outbox`` (or the compactor's own) makes the events
        to publish, written in the compaction's transaction.

        ``check_applied=False`` is for a caller that has just asked the store
        itself: the question costs a round trip, and the transaction answers
        it again anyway.
        """
        history = tuple(history)
        compaction_id = compaction_id or derive_compaction_id(conversation_id, history)
        unchanged = _Unchanged(history, compaction_id, self._counter)
        if not self.breaker.try_acquire(conversation_id):
            retry_in = self.breaker.retry_in(conversation_id)
            return unchanged(f"circuit open: retry in {retry_in:.0f}s", failed=True)

        started = time.perf_counter()
        try:
            if check_applied and await self._messages.compaction_applied(compaction_id):
                self.breaker.release(conversation_id)
                return unchanged.already_applied()
            split = split_history(history, self._config.keep_recent, self._config.scoring)
            if not split.to_compress:
                self.breaker.release(conversation_id)
                return unchanged("nothing to compress", failed=False)
            plan, batches, usage = await self._plan(history, split, conversation_id, compaction_id)
            applied = await self._messages.apply_compaction(plan, outbox or self._outbox)
        except asyncio.CancelledError:
            self.breaker.release(conversation_id)
            raise
        except HistoryConflictError as error:
            self.breaker.release(conversation_id)
            log.warning("compaction %s of %s conflicted: %s", compaction_id, conversation_id, error)
            return unchanged(f"history changed during compaction: {error}", failed=True)
        except Exception as error:
            self.breaker.record_failure(conversation_id)
            log.warning(
                "compaction %s of %s failed, history left unchanged: %s: %s",
                compaction_id,
                conversation_id,
                type(error).__name__,
                error,
            )
            return unchanged(f"{type(error).__name__}: {error}", failed=True)

        self.breaker.record_success(conversation_id)
        if applied.outcome == "already_applied" or applied.stats is None:
            return unchanged.already_applied()
        log.info(
            "compacted %s: %d messages into %d batches, %d → %d tokens in %.2fs",
            conversation_id,
            plan.messages_compressed,
            len(batches),
            plan.tokens_estimate_before,
            plan.tokens_estimate_after,
            time.perf_counter() - started,
        )
        return CompactionResult(
            history=(plan.clip_archive, *split.to_keep),
            batches_created=len(batches),
            messages_compressed=plan.messages_compressed,
            tokens_estimate_before=plan.tokens_estimate_before,
            tokens_estimate_after=plan.tokens_estimate_after,
            compaction_id=compaction_id,
            batches=batches,
            compressed_message_ids=tuple(m.id for m in split.to_compress),
            tokens_removed=applied.stats.tokens_removed,
            tokens_added=applied.stats.tokens_added,
            llm_input_tokens=usage.input_tokens,
            llm_output_tokens=usage.output_tokens,
        )

    async def _plan(
        self,
        history: tuple[ConversationMessage, ...],
        split: HistorySplit,
        conversation_id: str,
        compaction_id: str,
    ) -> tuple[CompactionPlan, tuple[StoredBatch, ...], _Usage]:
        config = self._config
        position = {message.id: index for index, message in enumerate(history)}
        chunks = chunk_messages(
            split.to_compress, config.chunk_size, config.max_chunk_tokens, self._counter
        )
        prior = split.prior_summary.content if split.prior_summary else None
        summaries = await self._summarize_chunks(chunks, position, prior)

        fresh = [
            StoredBatch(
                id=f"{compaction_id}:{index}",
                label=batch_label(conversation_id, batch.end_time),
                conversation_id=conversation_id,
                batch=batch,
                compaction_id=compaction_id,
            )
            for index, batch in enumerate(summaries.batches)
        ]
        existing = await self._memory.live_batches(conversation_id)
        live = [*existing, *fresh]
        superseded: list[tuple[str, str]] = []
        threshold = config.clip_first + config.clip_last + config.resummarize_buffer
        if len(live) > threshold:
            cut = len(live) - config.clip_last
            sources, tail = live[:cut], live[cut:]
            merged = await self._resummarize(sources, conversation_id, compaction_id, summaries)
            existing_ids = {batch.id for batch in existing}
            superseded = [(s.id, merged.id) for s in sources if s.id in existing_ids]
            source_ids = {s.id for s in sources}
            fresh = [
                b.model_copy(update={"superseded_by": merged.id}) if b.id in source_ids else b
                for b in fresh
            ]
            fresh.append(merged)
            live = [merged, *tail]

        content = build_clip_archive(
            [b.batch for b in live],
            clip_first=config.clip_first,
            clip_last=config.clip_last,
            messages_compressed=sum(b.batch.message_count for b in live),
            cycles=_previous_cycles(split.prior_summary, existing) + 1,
        )
        clip = clip_archive_message(
            conversation_id=conversation_id,
            compaction_id=compaction_id,
            content=content,
            created_at=min(b.batch.start_time for b in live),
        )
        deleted = [m.id for m in split.to_compress]
        if split.prior_summary is not None:
            deleted.append(split.prior_summary.id)
        plan = CompactionPlan(
            compaction_id=compaction_id,
            conversation_id=conversation_id,
            new_batches=tuple(fresh),
            superseded=tuple(superseded),
            deleted_message_ids=tuple(deleted),
            clip_archive=clip,
            messages_compressed=len(split.to_compress),
            tokens_estimate_before=estimate_history_tokens(history, self._counter),
            tokens_estimate_after=estimate_history_tokens((clip, *split.to_keep), self._counter),
        )
        return plan, tuple(fresh), summaries.usage

    async def _summarize_chunks(
        self, chunks: Sequence[Chunk], position: dict[str, int], prior: str | None
    ) -> _Summaries:
        """Fold-in: each chunk's request carries the summary so far (context-compaction.AC1.3).

        A timed-out chunk is split in halves that go to the front of the queue,
        so fold-in order is preserved.
        """
        out = _Summaries()
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
                text = await self._complete(request, out.usage)
            except ModelError as error:
                await self._retry_or_raise(error, attempt)
                if isinstance(error, ModelTimeoutError):
                    pending.extendleft(reversed([(half, attempt + 1) for half in halve(ordered)]))
                else:
                    pending.appendleft((ordered, attempt + 1))
                continue
            out.batches.append(
                SummaryBatch(
                    content=text,
                    depth=0,
                    start_time=min(m.created_at for m in ordered),
                    end_time=max(m.created_at for m in ordered),
                    message_count=len(ordered),
                    source_message_ids=tuple(m.id for m in ordered),
                )
            )
            running = text
        return out

    async def _resummarize(
        self,
        sources: Sequence[StoredBatch],
        conversation_id: str,
        compaction_id: str,
        summaries: _Summaries,
    ) -> StoredBatch:
        request = build_resummarization_request(
            system_prompt=self._config.prompt,
            batch_contents=[s.batch.content for s in sources],
            model_name=self._model_name,
            max_tokens=self._config.max_summary_tokens,
        )
        attempt = 0
        while True:
            try:
                text = await self._complete(request, summaries.usage)
                break
            except ModelError as error:
                await self._retry_or_raise(error, attempt)
                attempt += 1
        merged = SummaryBatch(
            content=text,
            depth=max(s.batch.depth for s in sources) + 1,
            start_time=min(s.batch.start_time for s in sources),
            end_time=max(s.batch.end_time for s in sources),
            message_count=sum(s.batch.message_count for s in sources),
            source_message_ids=tuple(i for s in sources for i in s.batch.source_message_ids),
        )
        return StoredBatch(
            id=f"{compaction_id}:resummarized",
            label=batch_label(conversation_id, merged.end_time),
            conversation_id=conversation_id,
            batch=merged,
            compaction_id=compaction_id,
        )

    async def _complete(self, request: ModelRequest, usage: _Usage) -> str:
        try:
            response = await asyncio.wait_for(
                self._model.complete(request), timeout=self._config.timeout_seconds
            )
        except TimeoutError as error:
            raise ModelTimeoutError(
                f"no answer within {self._config.timeout_seconds}s", provider=self._model.name
            ) from error
        usage.input_tokens += response.usage.input_tokens
        usage.output_tokens += response.usage.output_tokens
        text = response.text.strip()
        if not text:
            raise ModelResponseError(
                "the model returned an empty summary", provider=self._model.name
            )
        return text

    async def _retry_or_raise(self, error: ModelError, attempt: int) -> None:
        """The retry policy for every LLM call, so the two loops cannot drift:
        re-raise ``error`` when trying again cannot help or ``attempt`` (0 for
        the first call) has used up ``max_retries``, otherwise wait before the
        caller retries. What to retry with stays with the caller, since only
        the chunk loop can answer a timeout with a smaller request.

        The wait doubles per attempt, but never undercuts a rate limit's
        ``retry_after``: asking again sooner than the server said would only
        earn another 429.
        """
        if not error.retryable or attempt >= self._config.max_retries:
            raise error
        delay = self._config.retry_backoff_seconds * 2**attempt
        if isinstance(error, ModelRateLimitError) and error.retry_after is not None:
            delay = max(delay, error.retry_after)
        log.info("retrying LLM call in %.2fs after %s", delay, type(error).__name__)
        await self._sleep(delay)


def _previous_cycles(prior: ConversationMessage | None, existing: Sequence[StoredBatch]) -> int:
    """How many compactions came before, read from the prior clip-archive's header.

    Falls back to the compactions visible in archival memory if the header
    cannot be read (a hand-edited or foreign clip-archive).
    """
    if prior is not None:
        try:
            return parse_clip_archive(prior.content).cycles
        except ClipArchiveFormatError:
            pass
    return len({batch.compaction_id for batch in existing})


def create_compactor(
    *,
    model: ModelProvider,
    messages_store: MessageStore,
    memory_store: MemoryStore,
    config: CompactionConfig,
    model_name: str,
    counter: TokenCounter = DEFAULT_COUNTER,
    breaker: CircuitBreaker | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    outbox: OutboxFactory | None = None,
) -> PipelineCompactor:
    """The pipeline over the given ports.

    ``outbox`` turns a committed plan into events to publish; they are written
    in the compaction's own transaction (see ``MessageStore.apply_compaction``).
    """
    return PipelineCompactor(
        model=model,
        messages_store=messages_store,
        memory_store=memory_store,
        config=config,
        model_name=model_name,
        counter=counter,
        breaker=breaker
        or CircuitBreaker(config.max_consecutive_failures, config.circuit_cooldown_seconds),
        sleep=sleep,
        outbox=outbox,
    )
