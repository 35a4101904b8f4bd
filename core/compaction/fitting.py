"""The clip-archive under the target: how big it is, how to make it fit.

Given a budget, a compaction leaves the history at or under
``BudgetConfig.target_tokens``: a history left over budget would be handed
straight back as "nothing to compress", for ever. What stays live (the kept
messages, a restore's turns) is what it is; the clip-archive is what gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.compaction.batches import CompactionIds, LiveArchive
from core.compaction.spend import LlmSpend
from core.compaction.summarizer import Summarizer
from core.domain.clip_archive import (
    SHORTENED_NOTE,
    build_clip_archive,
    clip_archive_message,
    shortened,
)
from core.domain.compaction import (
    CompactionConfig,
    StoredBatch,
    SummaryBatch,
    longest_fitting_prefix,
    merged_batch,
)
from core.domain.messages import ConversationMessage
from core.domain.tokens import TokenCounter, estimate_history_tokens, estimate_message_tokens


@dataclass(frozen=True)
class ClipFitter:
    """Builds clip-archives and fits them under ``target`` (None: no target)."""

    config: CompactionConfig
    counter: TokenCounter
    target: int | None

    def clip(
        self, batches: Sequence[SummaryBatch], ids: CompactionIds, cycles: int
    ) -> ConversationMessage:
        content = build_clip_archive(
            batches,
            clip_first=self.config.clip_first,
            clip_last=self.config.clip_last,
            messages_compressed=sum(b.message_count for b in batches),
            cycles=cycles,
        )
        return clip_archive_message(
            conversation_id=ids.conversation_id,
            compaction_id=ids.compaction_id,
            content=content,
            created_at=min(b.start_time for b in batches),
        )

    def tokens(self, message: ConversationMessage) -> int:
        return estimate_message_tokens(message, self.counter)

    def over(self, clip: ConversationMessage, kept_tokens: int) -> bool:
        """Whether ``clip`` beside ``kept_tokens`` of live messages is over the target."""
        return self.target is not None and self.tokens(clip) + kept_tokens > self.target

    async def fit(
        self,
        archive: LiveArchive,
        room: int,
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
        ids, sources = archive.ids, list(archive.live)
        least = self.clip([merged_batch(sources, SHORTENED_NOTE)], ids, cycles)
        if self.tokens(least) > room:
            return None
        bare = self.clip([merged_batch(sources, "")], ids, cycles)
        max_tokens = max(1, min(self.config.max_summary_tokens, room - self.tokens(bare)))
        fitted = await summarizer.resummarize(
            sources,
            ids.conversation_id,
            ids.compaction_id,
            calls,
            suffix="fitted",
            max_tokens=max_tokens,
        )
        archive.merge(sources, fitted)
        return self._shown_within(fitted.batch, room, ids, cycles)

    def _shown_within(
        self, batch: SummaryBatch, room: int, ids: CompactionIds, cycles: int
    ) -> ConversationMessage:
        """The clip-archive of ``batch`` alone, its text shortened to fit ``room``."""
        clip = self.clip([batch], ids, cycles)
        if self.tokens(clip) <= room:
            return clip

        def showing(length: int) -> ConversationMessage:
            shown = batch.model_copy(update={"content": shortened(batch.content, length)})
            return self.clip([shown], ids, cycles)

        fits = longest_fitting_prefix(len(batch.content), lambda n: self.tokens(showing(n)) <= room)
        return showing(fits)

    def fitting_turns(
        self,
        turns: tuple[ConversationMessage, ...],
        kept_tokens: int,
        others: Sequence[StoredBatch],
        chosen: StoredBatch,
        ids: CompactionIds,
    ) -> tuple[tuple[ConversationMessage, ...], tuple[ConversationMessage, ...]]:
        """(the newest turns that fit under the target beside ``kept_tokens``, the
        older rest): the clip-archive is counted with a summary of the rest as
        long as ``max_summary_tokens`` allows, and a restored run never starts
        with a tool result."""
        if self.target is None:
            return turns, ()
        for count in range(len(turns), 0, -1):
            restored, rest = turns[len(turns) - count :], turns[: len(turns) - count]
            if restored[0].role == "tool":
                continue  # its call stays summarised: the pair stays together
            clip = self._clip_tokens_after_restore(others, chosen, rest, ids)
            if clip + kept_tokens + estimate_history_tokens(restored, self.counter) <= self.target:
                return restored, rest
        return (), turns

    def _clip_tokens_after_restore(
        self,
        others: Sequence[StoredBatch],
        chosen: StoredBatch,
        rest: Sequence[ConversationMessage],
        ids: CompactionIds,
    ) -> int:
        """The clip-archive a restore leaves: the other live batches and, in the
        chosen batch's place, a summary of ``rest`` allowed ``max_summary_tokens``
        (no more than ``rest`` itself). Counted as the clip-archive with that
        summary empty plus the allowance: the estimate is subadditive
        (``count(a + b) <= count(a) + count(b)``, tested for the default counter),
        so a summary within its allowance is never undercounted."""
        batches = [b.batch for b in others]
        allowance = 0
        if rest:
            allowance = min(
                self.config.max_summary_tokens, estimate_history_tokens(rest, self.counter)
            )
            batches.append(chosen.batch.model_copy(update={"content": ""}))
        if not batches:
            return 0
        return self.tokens(self.clip(batches, ids, 1)) + allowance

    def over_target_reason(
        self, clip: ConversationMessage, kept: Sequence[ConversationMessage], kept_tokens: int
    ) -> str | None:
        """Why the history stays over the target beside ``clip``; None when it does not."""
        if self.target is None:
            return None
        after = self.tokens(clip) + kept_tokens
        if after <= self.target:
            return None
        return (
            f"over target: {after} tokens > target {self.target}; the {len(kept)} messages "
            f"kept verbatim take {kept_tokens}, the clip-archive {self.tokens(clip)} "
            f"(lower keep_recent or raise the budget)"
        )
