"""The compaction pipeline (imperative shell).

split → chunk → fold-in summarise → re-summarise if too many batches → fit
the target → a ``CompactionPlan`` and the new history ``[clip_archive, *kept]``.

The compactor writes nothing: it reads the live batches and calls the model,
then hands back the plan, which the processor applies with the store's
``apply_compaction`` in one transaction keyed by the compaction id (so a
retried compaction is a no-op). If any LLM call fails there is no plan and the
caller gets its history back untouched with ``failed=True``
(context-compaction.AC1.7).

Every LLM call goes through the worker's one ``ProviderGuard``, so a provider
outage is met once for the whole worker rather than once per conversation.
Given a budget, a compaction leaves the history at or under
``BudgetConfig.target_tokens``: a history left over budget would be handed
straight back as "nothing to compress", for ever.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeAlias

from core.domain.budget import BudgetConfig
from core.domain.chunking import chunk_messages, in_history_order
from core.domain.circuit import CircuitBreaker
from core.domain.clip_archive import (
    SHORTENED_NOTE,
    ClipArchiveFormatError,
    batch_label,
    build_clip_archive,
    clip_archive_message,
    is_clip_archive,
    parse_clip_archive,
    shortened,
)
from core.domain.compaction import (
    CompactionConfig,
    CompactionPlan,
    CompactionResult,
    CompactionTuning,
    StoredBatch,
    SummaryBatch,
    longest_fitting_prefix,
    merged_batch,
    restored_by,
)
from core.domain.messages import ConversationMessage
from core.domain.split import HistorySplit, split_history
from core.domain.tenancy import tenant_of
from core.domain.tokens import (
    DEFAULT_COUNTER,
    TokenCounter,
    estimate_history_tokens,
    estimate_message_tokens,
)
from core.domain.usage import DEFAULT_PRICES, ModelPrice
from core.ports.model import (
    ModelAuthError,
    ModelProvider,
    ModelRateLimitError,
    ModelServerError,
    ModelTimeoutError,
)
from core.ports.storage import MemoryStore
from core.provider_guard import GuardLimits, ProviderGuard, ProviderUnavailableError
from core.summarizer import LlmSpend, Summarizer

log = logging.getLogger("compactor")

_COMPACTION_NAMESPACE = uuid.UUID("6f1c0d52-9a57-4c1e-8f2b-7f0e0c7a3d11")


def derive_compaction_id(conversation_id: str, history: Sequence[ConversationMessage]) -> str:
    """Same conversation, same history → same id, so a repeated call is recognised."""
    key = conversation_id + "\n" + "\n".join(message.id for message in history)
    return str(uuid.uuid5(_COMPACTION_NAMESPACE, key))


@dataclass
class _Archive:
    """The conversation's live batches as this compaction reshapes them."""

    conversation_id: str
    existing: list[StoredBatch]
    fresh: list[StoredBatch]
    live: list[StoredBatch] = field(init=False)
    superseded: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.live = [*self.existing, *self.fresh]

    def merge(self, sources: Sequence[StoredBatch], merged: StoredBatch) -> None:
        """``merged`` replaces ``sources`` (a prefix of ``live``) in the clip-archive;
        they leave it but stay searchable."""
        ids = {s.id for s in sources}
        existing_ids = {b.id for b in self.existing}
        self.superseded += [(s.id, merged.id) for s in sources if s.id in existing_ids]
        self.fresh = [
            b.model_copy(update={"superseded_by": merged.id}) if b.id in ids else b
            for b in self.fresh
        ]
        self.fresh.append(merged)
        self.live = [merged, *(b for b in self.live if b.id not in ids)]


@dataclass(frozen=True)
class _Planned:
    plan: CompactionPlan
    batches: tuple[StoredBatch, ...]
    over_target: str | None  # why the history stays over the target, if it does
    restored: tuple[ConversationMessage, ...] = ()  # a restore's turns, live again


_Step: TypeAlias = CompactionResult | tuple[_Planned, HistorySplit]


class _Unchanged:
    """Results that hand the caller its history back as it was."""

    def __init__(
        self,
        history: tuple[ConversationMessage, ...],
        compaction_id: str,
        counter: TokenCounter,
        target: int | None,
    ) -> None:
        self._history = history
        self._compaction_id = compaction_id
        self._tokens = estimate_history_tokens(history, counter)
        self._counter = counter
        self._target = target

    def __call__(
        self,
        reason: str,
        *,
        failed: bool,
        over_target: bool = False,
        provider_down: int | None = None,
    ) -> CompactionResult:
        return CompactionResult(
            provider_down_at=provider_down,
            history=self._history,
            tokens_estimate_before=self._tokens,
            tokens_estimate_after=self._tokens,
            failed=failed,
            reason=reason,
            compaction_id=self._compaction_id,
            over_target=over_target,
            target_tokens=self._target,
        )

    def nothing_to_compress(self, conversation_id: str, split: HistorySplit) -> CompactionResult:
        """Nothing to compress; said loudly when the history is over the target
        anyway, since then every later command will find the same."""
        if self._target is None or self._tokens <= self._target:
            return self("nothing to compress", failed=False)
        kept = estimate_history_tokens(split.to_keep, self._counter)
        reason = (
            f"nothing to compress, over target: {self._tokens} tokens > target {self._target}; "
            f"the {len(split.to_keep)} messages kept verbatim take {kept}"
        )
        log.warning("compaction of %s: %s", conversation_id, reason)
        return self(reason, failed=False, over_target=True)


class PipelineCompactor:
    """The seeds' pipeline behind the ``Compactor`` port; build it with ``create_compactor``."""

    def __init__(
        self,
        *,
        model: ModelProvider,
        memory_store: MemoryStore,
        config: CompactionConfig,
        model_name: str,
        counter: TokenCounter,
        breaker: CircuitBreaker,
        guard: ProviderGuard,
        budget: BudgetConfig | None,
        sleep: Callable[[float], Awaitable[None]],
        fallback: ModelProvider | None = None,
        prices: Mapping[str, ModelPrice] | None = None,
    ) -> None:
        self._memory = memory_store
        self._config = config
        self._counter = counter
        self._summarizer = Summarizer(
            model=model,
            config=config,
            model_name=model_name,
            guard=guard,
            sleep=sleep,
            counter=counter,
        )
        # The summariser of a tenant whose LLM budget for the day is spent: local,
        # so it neither takes a provider slot nor waits out a provider's outage.
        self._fallback = (
            Summarizer(
                model=fallback,
                config=config,
                model_name=fallback.name,
                guard=None,
                sleep=sleep,
                counter=counter,
            )
            if fallback is not None
            else None
        )
        self._prices = dict(DEFAULT_PRICES if prices is None else prices)
        self._target = budget.target_tokens if budget is not None else None
        self.breaker = breaker
        self.provider_guard = guard

    async def plan(
        self,
        history: Sequence[ConversationMessage],
        conversation_id: str,
        *,
        compaction_id: str | None = None,
        fallback: bool = False,
    ) -> CompactionResult:
        """The compaction of ``history``: ``CompactionResult.plan`` is what to write,
        None when the history stays as it is (failed, or nothing to compress).
        Nothing is written here; whether ``compaction_id`` was applied is the
        caller's question (it asks the store once, before planning).

        ``fallback``: summarise with the local fallback summariser (a tenant's
        LLM budget is spent), when the compactor has one."""
        history = tuple(history)
        summarizer = self._fallback if fallback and self._fallback else self._summarizer
        compaction_id = compaction_id or derive_compaction_id(conversation_id, history)
        unchanged = _Unchanged(history, compaction_id, self._counter, self._target)

        async def step(calls: LlmSpend) -> _Step:
            split = split_history(history, self._config.keep_recent, self._config.scoring)
            planned = None
            if split.to_compress or self._may_refit(history, split):
                planned = await self._plan(
                    history, split, conversation_id, compaction_id, calls, summarizer
                )
            if planned is None:
                return unchanged.nothing_to_compress(conversation_id, split)
            return planned, split

        return await self._attempt(unchanged, conversation_id, compaction_id, step, summarizer)

    async def _attempt(
        self,
        unchanged: _Unchanged,
        conversation_id: str,
        compaction_id: str,
        step: Callable[[LlmSpend], Awaitable[_Step]],
        summarizer: Summarizer | None = None,
    ) -> CompactionResult:
        """Run one planning ``step`` under the conversation's circuit breaker: a
        failure hands the history back unchanged (``provider_down`` when the
        provider was), a result from ``step`` (nothing to do) is returned as is."""
        if not self.breaker.try_acquire(conversation_id):
            retry_in = self.breaker.retry_in(conversation_id)
            return unchanged(f"circuit open: retry in {retry_in:.0f}s", failed=True)
        started = time.perf_counter()
        calls = LlmSpend(tenant=tenant_of(conversation_id))
        try:
            outcome = await step(calls)
        except asyncio.CancelledError:
            self.breaker.release(conversation_id)
            raise
        except Exception as error:
            answers = self.provider_guard.successes
            provider_down = answers if self._blame(error, conversation_id, calls) else None
            # Refusals come by the thousand in an outage; the guard logs the outage once.
            log.log(
                logging.INFO if isinstance(error, ProviderUnavailableError) else logging.WARNING,
                "compaction %s of %s failed, history left unchanged: %s: %s",
                compaction_id,
                conversation_id,
                type(error).__name__,
                error,
            )
            return unchanged(
                f"{type(error).__name__}: {error}", failed=True, provider_down=provider_down
            )
        if isinstance(outcome, CompactionResult):
            self.breaker.release(conversation_id)
            return outcome
        self.breaker.record_success(conversation_id)
        planned, split = outcome
        summarizer = summarizer or self._summarizer
        if calls.summarizer is None:
            calls.summarizer, calls.model = summarizer.provider, summarizer.model_name
        usage = calls.usage().priced(self._prices)
        if summarizer is self._fallback:
            usage = usage.model_copy(update={"fallback": True})
        planned = replace(planned, plan=planned.plan.model_copy(update={"usage": usage}))
        return self._planned(planned, split, calls, time.perf_counter() - started)

    # -- redo and undo (compactor recompact / restore) --------------------------

    async def recompact(
        self, history: Sequence[ConversationMessage], conversation_id: str, *, compaction_id: str
    ) -> CompactionResult:
        """Re-summarise the live batches from their archived raw turns with the
        current prompt, model and settings: one compaction whose new batches
        supersede them (a batch whose raw turns expired stays as it is). The live
        messages are kept; the clip-archive is rebuilt and fitted under the target."""
        history = tuple(history)
        unchanged = _Unchanged(history, compaction_id, self._counter, self._target)

        async def step(calls: LlmSpend) -> _Step:
            existing = await self._memory.live_batches(conversation_id)
            rebuilt, untouched, turns = await self._raw_turns(conversation_id, existing)
            if not rebuilt:
                why = "no live batch" if not existing else "no live batch has all its raw turns"
                return unchanged(f"nothing to recompact: {why}", failed=False)
            position = {turn.id: index for index, turn in enumerate(turns)}
            config = self._config
            chunks = chunk_messages(
                turns, config.chunk_size, config.max_chunk_tokens, self._counter
            )
            summaries = await self._summarizer.summarize_chunks(chunks, position, None, calls)
            fresh = self._stored(summaries, conversation_id, compaction_id)
            archive = _Archive(conversation_id, existing=untouched, fresh=fresh)
            archive.superseded += _replacements(rebuilt, fresh, position)
            split = _live_split(history)
            planned = await self._shaped(
                history, split, archive, existing, compaction_id, calls, rebuilding=True
            )
            assert planned is not None  # rebuilding: a plan, over the target or not
            return planned, split

        return await self._attempt(unchanged, conversation_id, compaction_id, step)

    async def _raw_turns(
        self, conversation_id: str, batches: Sequence[StoredBatch]
    ) -> tuple[list[StoredBatch], list[StoredBatch], list[ConversationMessage]]:
        """(batches whose every raw turn is archived, the others, those turns in
        conversation order)."""
        rebuilt: list[StoredBatch] = []
        untouched: list[StoredBatch] = []
        turns: dict[str, ConversationMessage] = {}
        for batch in batches:
            expanded = await self._memory.expand_batch(conversation_id, batch.id)
            if expanded is None or not expanded.turns or expanded.turns_missing:
                untouched.append(batch)
                continue
            rebuilt.append(batch)
            turns.update((turn.id, turn) for turn in expanded.turns)
        return rebuilt, untouched, sorted(turns.values(), key=lambda t: (t.created_at, t.id))

    async def restore(
        self,
        history: Sequence[ConversationMessage],
        conversation_id: str,
        *,
        compaction_id: str,
        batch_id: str | None = None,
    ) -> CompactionResult:
        """Bring the raw turns of a live batch (``batch_id``; None: the newest) back
        into the live history: the newest of them that fit under the target with
        the rest of the history. The turns that do not fit are summarised into a
        batch of their own in its place (``plan.not_restored_message_ids``)."""
        history = tuple(history)
        unchanged = _Unchanged(history, compaction_id, self._counter, self._target)

        async def step(calls: LlmSpend) -> _Step:
            existing = await self._memory.live_batches(conversation_id)
            chosen = _chosen_batch(existing, batch_id)
            if chosen is None:
                return unchanged(
                    f"nothing to restore: no live batch {batch_id or ''}", failed=False
                )
            expanded = await self._memory.expand_batch(conversation_id, chosen.id)
            turns = tuple(expanded.turns) if expanded is not None else ()
            if not turns:
                return unchanged(
                    f"nothing to restore: batch {chosen.id} has no raw turns", failed=False
                )
            split = _live_split(history)
            others = [b for b in existing if b.id != chosen.id]
            restored, rest = self._fitting_turns(turns, split, others, chosen, compaction_id)
            if not restored:
                return unchanged(f"no turn of batch {chosen.id} fits the target", failed=False)
            fresh: list[StoredBatch] = []
            if rest:
                position = {turn.id: index for index, turn in enumerate(rest)}
                config = self._config
                chunks = chunk_messages(
                    rest, config.chunk_size, config.max_chunk_tokens, self._counter
                )
                summaries = await self._summarizer.summarize_chunks(chunks, position, None, calls)
                fresh = self._stored(summaries, conversation_id, compaction_id)
            archive = _Archive(conversation_id, existing=others, fresh=fresh)
            archive.superseded.append(
                (chosen.id, fresh[0].id if fresh else restored_by(compaction_id))
            )
            planned = await self._shaped(
                history, split, archive, existing, compaction_id, calls, restored, rebuilding=True
            )
            assert planned is not None  # rebuilding: a plan, over the target or not
            left = tuple(t.id for t in rest)
            plan = planned.plan.model_copy(update={"not_restored_message_ids": left})
            return _Planned(plan, planned.batches, planned.over_target, restored), split

        return await self._attempt(unchanged, conversation_id, compaction_id, step)

    def _fitting_turns(
        self,
        turns: tuple[ConversationMessage, ...],
        split: HistorySplit,
        others: Sequence[StoredBatch],
        chosen: StoredBatch,
        compaction_id: str,
    ) -> tuple[tuple[ConversationMessage, ...], tuple[ConversationMessage, ...]]:
        """(the newest turns that fit under the target, the older rest): the clip-archive
        is counted with a summary of the rest as long as ``max_summary_tokens``
        allows, and a restored run never starts with a tool result."""
        if self._target is None:
            return turns, ()
        kept = estimate_history_tokens(split.to_keep, self._counter)
        for count in range(len(turns), 0, -1):
            restored, rest = turns[len(turns) - count :], turns[: len(turns) - count]
            if restored[0].role == "tool":
                continue  # its call stays summarised: the pair stays together
            batches = [b.batch for b in others]
            if rest:
                size = min(
                    self._config.max_summary_tokens, estimate_history_tokens(rest, self._counter)
                )
                batches.append(chosen.batch.model_copy(update={"content": "x " * size}))
            clip = 0
            if batches:
                clip = self._tokens(self._clip(batches, chosen.conversation_id, compaction_id, 1))
            if clip + kept + estimate_history_tokens(restored, self._counter) <= self._target:
                return restored, rest
        return (), turns

    async def provider_answers(self, since: int) -> None:
        """Return once the provider answered after a compaction failed with
        ``provider_down_at=since`` (``ProviderGuard.until_answering``)."""
        await self.provider_guard.until_answering(since)

    def _blame(self, error: Exception, conversation_id: str, calls: LlmSpend) -> bool:
        """Count a failure against the conversation's breaker only when it is the
        conversation's: a provider outage is the provider guard's business, and
        counting it against every conversation would shut them all out for a
        cool-down after the provider is back. ``True`` for a provider outage.

        Rate limits, refusals by the guard and a rejected key are never the
        conversation's. A 5xx or a timeout is, when other calls got answers
        while this compaction's kept failing (its request is the trouble:
        too large, or one the provider chokes on); otherwise it is an outage.
        """
        if isinstance(error, ProviderUnavailableError | ModelRateLimitError | ModelAuthError):
            provider_wide = True
        elif isinstance(error, ModelServerError | ModelTimeoutError):
            first = calls.answers_at_first_failure
            provider_wide = first is None or self.provider_guard.successes <= first
        else:
            provider_wide = False
        if provider_wide:
            self.breaker.release(conversation_id)
        else:
            self.breaker.record_failure(conversation_id)
        return provider_wide

    def _planned(
        self, planned: _Planned, split: HistorySplit, calls: LlmSpend, elapsed: float
    ) -> CompactionResult:
        plan = planned.plan
        log.info(
            "planned %s: %d messages into %d batches, %d → %d tokens in %.2fs",
            plan.conversation_id,
            plan.messages_compressed,
            len(planned.batches),
            plan.tokens_estimate_before,
            plan.tokens_estimate_after,
            elapsed,
        )
        if planned.over_target is not None:
            log.warning("compaction of %s: %s", plan.conversation_id, planned.over_target)
        clip = () if plan.clip_archive is None else (plan.clip_archive,)
        return CompactionResult(
            history=(*clip, *split.to_keep, *planned.restored),
            messages_restored=len(planned.restored),
            batches_created=len(planned.batches),
            messages_compressed=plan.messages_compressed,
            tokens_estimate_before=plan.tokens_estimate_before,
            tokens_estimate_after=plan.tokens_estimate_after,
            compaction_id=plan.compaction_id,
            batches=planned.batches,
            compressed_message_ids=tuple(m.id for m in split.to_compress),
            llm_input_tokens=calls.input_tokens,
            llm_output_tokens=calls.output_tokens,
            usage=plan.usage,
            reason=planned.over_target,
            over_target=planned.over_target is not None,
            target_tokens=self._target,
            plan=plan,
        )

    def _may_refit(self, history: tuple[ConversationMessage, ...], split: HistorySplit) -> bool:
        """Nothing to compress, but a clip-archive that could shrink: a history an
        earlier compaction (or an earlier version) left over the target."""
        return (
            self._target is not None
            and split.prior_summary is not None
            and estimate_history_tokens(history, self._counter) > self._target
        )

    async def _plan(
        self,
        history: tuple[ConversationMessage, ...],
        split: HistorySplit,
        conversation_id: str,
        compaction_id: str,
        calls: LlmSpend,
        summarizer: Summarizer,
    ) -> _Planned | None:
        """Everything to write; ``None`` when there is nothing to compress and
        the clip-archive cannot be made to fit either."""
        config = self._config
        position = {message.id: index for index, message in enumerate(history)}
        to_chunk = split.to_compress
        if config.chunk_order == "chronological":
            to_chunk = in_history_order(to_chunk, position)
        chunks = chunk_messages(to_chunk, config.chunk_size, config.max_chunk_tokens, self._counter)
        prior = split.prior_summary.content if split.prior_summary else None
        summaries = await summarizer.summarize_chunks(chunks, position, prior, calls)
        fresh = self._stored(summaries, conversation_id, compaction_id)
        existing = await self._memory.live_batches(conversation_id)
        archive = _Archive(conversation_id, existing=existing, fresh=fresh)
        if not archive.live:
            return None
        return await self._shaped(
            history, split, archive, existing, compaction_id, calls, summarizer=summarizer
        )

    def _stored(
        self, summaries: Sequence[SummaryBatch], conversation_id: str, compaction_id: str
    ) -> list[StoredBatch]:
        return [
            StoredBatch(
                id=f"{compaction_id}:{index}",
                label=batch_label(conversation_id, batch.end_time),
                conversation_id=conversation_id,
                batch=batch,
                compaction_id=compaction_id,
            )
            for index, batch in enumerate(summaries)
        ]

    async def _shaped(
        self,
        history: tuple[ConversationMessage, ...],
        split: HistorySplit,
        archive: _Archive,
        existing: Sequence[StoredBatch],
        compaction_id: str,
        calls: LlmSpend,
        restored: tuple[ConversationMessage, ...] = (),
        rebuilding: bool = False,
        summarizer: Summarizer | None = None,
    ) -> _Planned | None:
        """Re-summarise when there are too many live batches, build the clip-archive
        and fit it under the target with what stays live (``split.to_keep`` and any
        ``restored`` turns): the plan. ``None`` when nothing is compressed (and not
        ``rebuilding``: a recompact, a restore) and the clip-archive cannot be made
        to fit."""
        summarizer = summarizer or self._summarizer
        config = self._config
        conversation_id = archive.conversation_id
        if not archive.live:  # a restore brought every archived turn back: no clip-archive
            plan = self._compaction_plan(
                history, split, archive, None, compaction_id, conversation_id, restored
            )
            return _Planned(plan, tuple(archive.fresh), None, restored)
        threshold = config.clip_first + config.clip_last + config.resummarize_buffer
        if len(archive.live) > threshold:
            sources = archive.live[: len(archive.live) - config.clip_last]
            merged = await summarizer.resummarize(
                sources, conversation_id, compaction_id, calls, suffix="resummarized"
            )
            archive.merge(sources, merged)

        cycles = _previous_cycles(split.prior_summary, existing) + 1
        clip = self._clip([b.batch for b in archive.live], conversation_id, compaction_id, cycles)
        live = (*split.to_keep, *restored)
        kept_tokens = estimate_history_tokens(live, self._counter)
        over_target = None
        if self._target is not None and self._tokens(clip) + kept_tokens > self._target:
            room = self._target - kept_tokens
            fitted = await self._fit(
                archive, room, (conversation_id, compaction_id), calls, cycles, summarizer
            )
            if fitted is None and not split.to_compress and not rebuilding:
                return None
            clip = fitted or clip
            over_target = self._over_target_reason(clip, live, kept_tokens)
        plan = self._compaction_plan(
            history, split, archive, clip, compaction_id, conversation_id, restored
        )
        return _Planned(plan, tuple(archive.fresh), over_target, restored)

    def _compaction_plan(
        self,
        history: tuple[ConversationMessage, ...],
        split: HistorySplit,
        archive: _Archive,
        clip: ConversationMessage | None,
        compaction_id: str,
        conversation_id: str,
        restored: Sequence[ConversationMessage] = (),
    ) -> CompactionPlan:
        deleted = [m.id for m in split.to_compress]
        if split.prior_summary is not None:
            deleted.append(split.prior_summary.id)
        after = (*([] if clip is None else [clip]), *split.to_keep, *restored)
        return CompactionPlan(
            compaction_id=compaction_id,
            conversation_id=conversation_id,
            new_batches=tuple(archive.fresh),
            superseded=tuple(archive.superseded),
            deleted_message_ids=tuple(deleted),
            clip_archive=clip,
            messages_compressed=len(split.to_compress),
            tokens_estimate_before=estimate_history_tokens(history, self._counter),
            tokens_estimate_after=estimate_history_tokens(after, self._counter),
            restored_message_ids=tuple(m.id for m in restored),
        )

    def _clip(
        self,
        batches: Sequence[SummaryBatch],
        conversation_id: str,
        compaction_id: str,
        cycles: int,
    ) -> ConversationMessage:
        content = build_clip_archive(
            batches,
            clip_first=self._config.clip_first,
            clip_last=self._config.clip_last,
            messages_compressed=sum(b.message_count for b in batches),
            cycles=cycles,
        )
        return clip_archive_message(
            conversation_id=conversation_id,
            compaction_id=compaction_id,
            content=content,
            created_at=min(b.start_time for b in batches),
        )

    def _tokens(self, message: ConversationMessage) -> int:
        return estimate_message_tokens(message, self._counter)

    async def _fit(
        self,
        archive: _Archive,
        room: int,
        ids: tuple[str, str],
        calls: LlmSpend,
        cycles: int,
        summarizer: Summarizer,
    ) -> ConversationMessage | None:
        """A clip-archive of at most ``room`` tokens, or ``None`` when not even one
        showing nothing but its pointer to archival memory fits.

        Every live batch is re-summarised into one, asking the model for no
        more than fits; a model that writes past ``max_tokens`` (or a token
        count that differs from the estimate) gets its text shortened in the
        clip-archive only, the batch in archival memory keeps all of it.
        Showing fewer batches would not do: the clip-archive already shows only
        ``clip_first + clip_last``, and all of them may be at the size cap.
        """
        conversation_id, compaction_id = ids
        sources = list(archive.live)
        least = self._clip(
            [merged_batch(sources, SHORTENED_NOTE)], conversation_id, compaction_id, cycles
        )
        if self._tokens(least) > room:
            return None
        bare = self._clip([merged_batch(sources, "")], conversation_id, compaction_id, cycles)
        max_tokens = max(1, min(self._config.max_summary_tokens, room - self._tokens(bare)))
        fitted = await summarizer.resummarize(
            sources, conversation_id, compaction_id, calls, suffix="fitted", max_tokens=max_tokens
        )
        archive.merge(sources, fitted)
        batch = fitted.batch
        clip = self._clip([batch], conversation_id, compaction_id, cycles)
        if self._tokens(clip) <= room:
            return clip

        def showing(length: int) -> ConversationMessage:
            shown = batch.model_copy(update={"content": shortened(batch.content, length)})
            return self._clip([shown], conversation_id, compaction_id, cycles)

        fits = longest_fitting_prefix(
            len(batch.content), lambda n: self._tokens(showing(n)) <= room
        )
        return showing(fits)

    def _over_target_reason(
        self, clip: ConversationMessage, kept: Sequence[ConversationMessage], kept_tokens: int
    ) -> str | None:
        assert self._target is not None
        after = self._tokens(clip) + kept_tokens
        if after <= self._target:
            return None
        return (
            f"over target: {after} tokens > target {self._target}; the {len(kept)} messages "
            f"kept verbatim take {kept_tokens}, the clip-archive {self._tokens(clip)} "
            f"(lower keep_recent or raise the budget)"
        )


def _live_split(history: Sequence[ConversationMessage]) -> HistorySplit:
    """The history as a recompact or restore sees it: the clip-archive it replaces,
    and every other message kept live."""
    prior = next((m for m in history if is_clip_archive(m)), None)
    kept = tuple(m for m in history if m is not prior)
    return HistorySplit(to_compress=(), to_keep=kept, prior_summary=prior)


def _chosen_batch(existing: Sequence[StoredBatch], batch_id: str | None) -> StoredBatch | None:
    if batch_id is None:
        return existing[-1] if existing else None
    return next((b for b in existing if b.id == batch_id), None)


def _replacements(
    rebuilt: Sequence[StoredBatch], fresh: Sequence[StoredBatch], position: dict[str, int]
) -> list[tuple[str, str]]:
    """(old batch, the new batch that summarises its earliest turn): what supersedes
    what, so the new batches take the old ones' places in the clip-archive."""
    owner = {turn: batch.id for batch in fresh for turn in batch.batch.source_message_ids}
    pairs = []
    for old in rebuilt:
        turns = [t for t in old.batch.source_message_ids if t in position]
        first = min(turns, key=position.__getitem__) if turns else None
        pairs.append((old.id, owner.get(first or "", fresh[0].id)))
    return pairs


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


def guard_limits(
    config: CompactionTuning, tenant_weights: Mapping[str, float] | None = None
) -> GuardLimits:
    return GuardLimits(
        fair_share=config.fair_share,
        tenant_weights=dict(tenant_weights or {}),
        max_concurrent=config.max_concurrent_llm_calls,
        failure_threshold=config.provider_failure_threshold,
        cooldown_seconds=config.provider_cooldown_seconds,
        max_cooldown_seconds=config.provider_max_cooldown_seconds,
        max_wait_seconds=config.provider_max_wait_seconds,
    )


def create_compactor(
    *,
    model: ModelProvider,
    memory_store: MemoryStore,
    config: CompactionConfig,
    model_name: str,
    counter: TokenCounter = DEFAULT_COUNTER,
    budget: BudgetConfig | None = None,
    breaker: CircuitBreaker | None = None,
    guard: ProviderGuard | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
    tenant_weights: Mapping[str, float] | None = None,
    fallback: ModelProvider | None = None,
    prices: Mapping[str, ModelPrice] | None = None,
) -> PipelineCompactor:
    """The pipeline over the given ports.

    ``budget`` sets the target every compaction must reach
    (``BudgetConfig.target_tokens``); without it there is none.
    ``sleep`` and ``clock`` drive every wait and cool-down, so a test can
    replace both (they must agree: a sleep advances the clock).
    ``tenant_weights`` weigh the tenants' shares of the guard's slots
    (``[[tenants]]`` ``weight``; 1 for a tenant without one).
    ``fallback``: the summariser ``plan(..., fallback=True)`` uses (the
    extractive one, for a tenant whose LLM budget is spent); ``prices``: the
    price table a compaction's cost is estimated with (``[usage].prices``).
    """
    return PipelineCompactor(
        model=model,
        memory_store=memory_store,
        config=config,
        model_name=model_name,
        counter=counter,
        breaker=breaker
        or CircuitBreaker(
            config.max_consecutive_failures, config.circuit_cooldown_seconds, clock=clock
        ),
        guard=guard
        or ProviderGuard(guard_limits(config, tenant_weights), clock=clock, sleep=sleep),
        budget=budget,
        sleep=sleep,
        fallback=fallback,
        prices=prices,
    )
