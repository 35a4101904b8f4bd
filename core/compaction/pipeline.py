"""An ordinary compaction: split → chunk → fold-in summarise → re-summarise if
too many batches → fit the target → the plan and the new history
``[clip_archive, *kept]``.

The pipeline is the glue; each step is its module's (``core.domain.split``,
``core.domain.chunking``, ``summarizer``, the archive's ``MemoryReader``,
``batches``, ``fitting``, ``writes``). Nothing is written here: the pipeline
reads the live batches and calls the model, and its plan is applied by the
processor in one transaction keyed by the compaction id. ``Pipeline.shape``
(re-summarise, fit, plan) is shared with the operators' recompact and restore
(``core.compaction.redo``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from core.compaction.batches import CompactionIds, LiveArchive, cycles_after, stored_batches
from core.compaction.fitting import ClipFitter
from core.compaction.offload import Offload, ThreadOffload
from core.compaction.spend import LlmSpend
from core.compaction.strategies import StrategyPass, run_strategies
from core.compaction.strategies.planning import strategies_only, with_strategies
from core.compaction.summarizer import Summarizer
from core.compaction.writes import compaction_writes
from core.domain.chunking import Chunk, chunk_messages, in_history_order
from core.domain.compaction import CompactionConfig, Planned, Unchanged
from core.domain.keep_rules import keep_test
from core.domain.messages import ConversationMessage
from core.domain.split import HistorySplit, split_history
from core.domain.strategies import StrategyName
from core.domain.tenancy import tenant_of
from core.domain.tokens import TokenCounter, estimate_history_tokens
from core.ports.storage import MemoryReader

log = logging.getLogger("compactor")

History = tuple[ConversationMessage, ...]


@dataclass(frozen=True)
class Pipeline:
    memory: MemoryReader
    config: CompactionConfig
    counter: TokenCounter
    fitter: ClipFitter
    offload: Offload = field(default_factory=ThreadOffload)  # the steps that read every turn

    async def compaction(
        self, history: History, ids: CompactionIds, calls: LlmSpend, summarizer: Summarizer
    ) -> Planned | Unchanged:
        """The compaction of ``history``, or why there is none: the cheap strategies
        first (``core.compaction.strategies``), then, unless they reached the
        target, ``summarize``."""
        passed = await self.cheap_strategies(history, ids)
        summarizing = "summarize" in self._strategy_names(ids)
        if not passed.replaced and not summarizing:
            return Unchanged("the strategies found nothing to replace")
        if not passed.replaced:
            outcome = await self._summarize(history, ids, calls, summarizer)
            if isinstance(outcome, Unchanged):
                return outcome
            return with_strategies(outcome, history, passed, self.counter)
        id_pair = (ids.conversation_id, ids.compaction_id)
        if passed.at_target or not summarizing:
            return strategies_only(history, passed, id_pair, calls, self.counter)
        outcome = await self._summarize(passed.history, ids, calls, summarizer)
        if isinstance(outcome, Unchanged):
            return strategies_only(history, passed, id_pair, calls, self.counter)
        return with_strategies(outcome, history, passed, self.counter)

    def _strategy_names(self, ids: CompactionIds) -> tuple[StrategyName, ...]:
        return self.config.strategies.for_tenant(tenant_of(ids.conversation_id))

    async def cheap_strategies(self, history: History, ids: CompactionIds) -> StrategyPass:
        """The tenant's strategies before ``summarize`` on ``history`` (also run by
        the operator's recompact, ``core.compaction.redo``)."""
        names, config = self._strategy_names(ids), self.config.strategies
        target, counter = self.fitter.target, self.counter
        return await self.offload(lambda: run_strategies(history, names, config, counter, target))

    async def _summarize(
        self, history: History, ids: CompactionIds, calls: LlmSpend, summarizer: Summarizer
    ) -> Planned | Unchanged:
        """Today's LLM pipeline, the ``summarize`` strategy."""
        config = self.config
        rules = config.keep_verbatim.get(tenant_of(ids.conversation_id) or "")
        split = await self.offload(
            lambda: split_history(
                history, config.keep_recent, config.scoring, keep_test(history, rules)
            )
        )
        planned = None
        if split.to_compress or self._may_refit(history, split):
            planned = await self._summarised(history, split, ids, calls, summarizer)
        if planned is None:
            return self._nothing_to_compress(history, split, ids.conversation_id)
        return planned

    def chunks(self, messages: Sequence[ConversationMessage]) -> Sequence[Chunk]:
        config = self.config
        return chunk_messages(
            messages,
            config.chunk_size,
            config.max_chunk_tokens,
            self.counter,
            min_chunk_tokens=config.min_chunk_tokens,
        )

    async def _summarised(
        self,
        history: History,
        split: HistorySplit,
        ids: CompactionIds,
        calls: LlmSpend,
        summarizer: Summarizer,
    ) -> Planned | None:
        """The messages to compress summarised, then shaped into a plan; ``None``
        when there is nothing to compress and the clip-archive cannot be made
        to fit either."""
        position = {message.id: index for index, message in enumerate(history)}
        to_chunk = split.to_compress
        if self.config.chunk_order == "chronological":
            to_chunk = in_history_order(to_chunk, position)
        prior = split.prior_summary.content if split.prior_summary else None
        summaries = await summarizer.summarize_chunks(self.chunks(to_chunk), position, prior, calls)
        existing = await self.memory.live_batches(ids.conversation_id)
        archive = LiveArchive(ids, existing=existing, fresh=stored_batches(summaries, ids))
        if not archive.live:
            return None
        cycles = cycles_after(split.prior_summary, existing)
        return await self.shape(history, split, archive, cycles, calls, summarizer)

    async def shape(
        self,
        history: History,
        split: HistorySplit,
        archive: LiveArchive,
        cycles: int,
        calls: LlmSpend,
        summarizer: Summarizer,
        *,
        restored: History = (),
        rebuilding: bool = False,
    ) -> Planned | None:
        """Re-summarise when there are too many live batches, build the clip-archive
        and fit it under the target with what stays live (``split.to_keep`` and any
        ``restored`` turns): the plan. ``None`` when nothing is compressed (and not
        ``rebuilding``: a recompact, a restore) and the clip-archive cannot be made
        to fit."""
        if not archive.live:  # a restore brought every archived turn back: no clip-archive
            return compaction_writes(history, split, archive, None, restored, self.counter, calls)
        await self._resummarise_overflow(archive, calls, summarizer)
        clip = self.fitter.clip([b.batch for b in archive.live], archive.ids, cycles)
        live = (*split.to_keep, *restored)
        kept_tokens = estimate_history_tokens(live, self.counter)
        over_target = None
        if self.fitter.over(clip, kept_tokens):
            room = (self.fitter.target or 0) - kept_tokens
            fitted = await self.fitter.fit(archive, room, calls, cycles, summarizer)
            if fitted is None and not split.to_compress and not rebuilding:
                return None
            clip = fitted or clip
            over_target = self.fitter.over_target_reason(clip, live, kept_tokens)
        return compaction_writes(
            history,
            split,
            archive,
            clip,
            restored,
            self.counter,
            calls,
            over_target,
            self.fitter.target,
        )

    async def _resummarise_overflow(
        self, archive: LiveArchive, calls: LlmSpend, summarizer: Summarizer
    ) -> None:
        """More live batches than ``clip_first + clip_last + resummarize_buffer``:
        all but the last ``clip_last`` become one deeper batch."""
        config = self.config
        threshold = config.clip_first + config.clip_last + config.resummarize_buffer
        if len(archive.live) <= threshold:
            return
        sources = archive.live[: len(archive.live) - config.clip_last]
        ids = archive.ids
        merged = await summarizer.resummarize(
            sources, ids.conversation_id, ids.compaction_id, calls, suffix="resummarized"
        )
        archive.merge(sources, merged)

    def _may_refit(self, history: History, split: HistorySplit) -> bool:
        """Nothing to compress, but a clip-archive that could shrink: a history an
        earlier compaction (or an earlier version) left over the target."""
        target = self.fitter.target
        return (
            target is not None
            and split.prior_summary is not None
            and estimate_history_tokens(history, self.counter) > target
        )

    def _nothing_to_compress(
        self, history: History, split: HistorySplit, conversation_id: str
    ) -> Unchanged:
        """Nothing to compress; said loudly when the history is over the target
        anyway, since then every later command will find the same."""
        target = self.fitter.target
        tokens = estimate_history_tokens(history, self.counter)
        if target is None or tokens <= target:
            return Unchanged("nothing to compress")
        kept = estimate_history_tokens(split.to_keep, self.counter)
        reason = (
            f"nothing to compress, over target: {tokens} tokens > target {target}; "
            f"the {len(split.to_keep)} messages kept verbatim take {kept}"
        )
        log.warning("compaction of %s: %s", conversation_id, reason)
        return Unchanged(reason, over_target=True)
