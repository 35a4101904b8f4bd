"""Redo and undo (``compactor recompact`` / ``restore``, docs/memory.md).

Both read the archive (live batches and their raw turns), summarise what
needs it and end in ``Pipeline.shape`` like any compaction, so they are
fitted under the target and applied and published the same way. A recompact
runs the tenant's cheap strategies on the live history first, as a compaction
does; a restore does not (it is an undo: clearing would take back the turns
the operator asked for).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from core.compaction.batches import (
    CompactionIds,
    LiveArchive,
    chosen_batch,
    cycles_after,
    live_split,
    replacements,
    stored_batches,
)
from core.compaction.pipeline import History, Pipeline
from core.compaction.spend import LlmSpend
from core.compaction.strategies.planning import strategies_only, with_strategies
from core.compaction.summarizer import Summarizer
from core.domain.compaction import Planned, StoredBatch, Unchanged, restored_by
from core.domain.messages import ConversationMessage
from core.domain.tokens import estimate_history_tokens
from core.ports.storage import MemoryReader


@dataclass(frozen=True)
class Redo:
    pipeline: Pipeline
    memory: MemoryReader
    summarizer: Summarizer

    async def recompact(
        self, history: History, ids: CompactionIds, calls: LlmSpend
    ) -> Planned | Unchanged:
        """The tenant's cheap strategies on the live history (as a compaction runs
        them), then the live batches re-summarised from their archived raw turns
        with the current prompt, model and settings: one compaction whose new
        batches supersede them (a batch whose raw turns expired stays as it is).
        The live messages are kept (cleared or offloaded as the strategies say);
        the clip-archive is rebuilt and fitted under the target."""
        passed = await self.pipeline.cheap_strategies(history, ids)
        planned = await self._rebuilt(passed.history, ids, calls)
        counter = self.pipeline.counter
        if not passed.replaced:
            return planned
        if isinstance(planned, Unchanged):  # no batch to rebuild: the strategies alone
            id_pair = (ids.conversation_id, ids.compaction_id)
            return strategies_only(history, passed, id_pair, calls, counter)
        return with_strategies(planned, history, passed, counter)

    async def _rebuilt(
        self, history: History, ids: CompactionIds, calls: LlmSpend
    ) -> Planned | Unchanged:
        """The live batches rebuilt from their raw turns, ``history`` kept live."""
        existing = await self.memory.live_batches(ids.conversation_id)
        rebuilt, untouched, turns = await self._raw_turns(ids.conversation_id, existing)
        if not rebuilt:
            why = "no live batch" if not existing else "no live batch has all its raw turns"
            return Unchanged(f"nothing to recompact: {why}")
        position = {turn.id: index for index, turn in enumerate(turns)}
        chunks = self.pipeline.chunks(turns)
        summaries = await self.summarizer.summarize_chunks(chunks, position, None, calls)
        fresh = stored_batches(summaries, ids)
        archive = LiveArchive(ids, existing=untouched, fresh=fresh)
        archive.superseded += replacements(rebuilt, fresh, position)
        split = live_split(history)
        cycles = cycles_after(split.prior_summary, existing)
        planned = await self.pipeline.shape(
            history, split, archive, cycles, calls, self.summarizer, rebuilding=True
        )
        assert planned is not None  # rebuilding: a plan, over the target or not
        return planned

    async def _raw_turns(
        self, conversation_id: str, batches: Sequence[StoredBatch]
    ) -> tuple[list[StoredBatch], list[StoredBatch], list[ConversationMessage]]:
        """(batches whose every raw turn is archived, the others, those turns in
        conversation order)."""
        rebuilt: list[StoredBatch] = []
        untouched: list[StoredBatch] = []
        turns: dict[str, ConversationMessage] = {}
        for batch in batches:
            expanded = await self.memory.expand_batch(conversation_id, batch.id)
            if expanded is None or not expanded.turns or expanded.turns_missing:
                untouched.append(batch)
                continue
            rebuilt.append(batch)
            turns.update((turn.id, turn) for turn in expanded.turns)
        return rebuilt, untouched, sorted(turns.values(), key=lambda t: (t.created_at, t.id))

    async def restore(
        self, history: History, ids: CompactionIds, batch_id: str | None, calls: LlmSpend
    ) -> Planned | Unchanged:
        """Bring the raw turns of a live batch (``batch_id``; None: the newest) back
        into the live history: the newest of them that fit under the target with
        the rest of the history. The turns that do not fit are summarised into a
        batch of their own in its place (``plan.not_restored_message_ids``)."""
        existing = await self.memory.live_batches(ids.conversation_id)
        chosen = chosen_batch(existing, batch_id)
        if chosen is None:
            return Unchanged(f"nothing to restore: no live batch {batch_id or ''}")
        expanded = await self.memory.expand_batch(ids.conversation_id, chosen.id)
        if expanded is None or not expanded.turns:
            return Unchanged(f"nothing to restore: batch {chosen.id} has no raw turns")
        split = live_split(history)
        others = [b for b in existing if b.id != chosen.id]
        kept = estimate_history_tokens(split.to_keep, self.pipeline.counter)
        fitter = self.pipeline.fitter
        restored, rest = fitter.fitting_turns(expanded.turns, kept, others, chosen, ids)
        if not restored:
            return Unchanged(f"no turn of batch {chosen.id} fits the target")
        fresh = await self._summarised(rest, ids, calls)
        archive = LiveArchive(ids, existing=others, fresh=fresh)
        archive.superseded.append(
            (chosen.id, fresh[0].id if fresh else restored_by(ids.compaction_id))
        )
        cycles = cycles_after(split.prior_summary, existing)
        planned = await self.pipeline.shape(
            history, split, archive, cycles, calls, self.summarizer, restored=restored,
            rebuilding=True,
        )  # fmt: skip
        assert planned is not None  # rebuilding: a plan, over the target or not
        plan = planned.plan.model_copy(
            update={
                "not_restored_message_ids": tuple(t.id for t in rest),
                "restored_tokens": sum(expanded.turn_tokens[t.id] for t in restored),
            }
        )
        return replace(planned, plan=plan)

    async def _summarised(
        self, turns: Sequence[ConversationMessage], ids: CompactionIds, calls: LlmSpend
    ) -> list[StoredBatch]:
        """The turns a restore leaves archived, summarised in the restored batch's place."""
        if not turns:
            return []
        position = {turn.id: index for index, turn in enumerate(turns)}
        chunks = self.pipeline.chunks(turns)
        summaries = await self.summarizer.summarize_chunks(chunks, position, None, calls)
        return stored_batches(summaries, ids)
