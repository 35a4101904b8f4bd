"""What a compaction writes (its ``CompactionPlan``) and the history the model sees
once it is written: the last step of every compaction's planning, an ordinary
one (``pipeline``) or an operator's (``redo``)."""

from __future__ import annotations

from core.compaction.batches import LiveArchive
from core.compaction.spend import LlmSpend
from core.domain.compaction import CompactionPlan, Planned
from core.domain.messages import ConversationMessage
from core.domain.split import HistorySplit
from core.domain.tokens import TokenCounter, estimate_history_tokens, estimate_message_tokens

History = tuple[ConversationMessage, ...]


def compaction_writes(
    history: History,
    split: HistorySplit,
    archive: LiveArchive,
    clip: ConversationMessage | None,
    restored: History,
    counter: TokenCounter,
    calls: LlmSpend,
    over_target: str | None = None,
    target: int | None = None,
) -> Planned:
    """The compressed messages (and the clip-archive they replace) deleted, the
    archive's new and superseded batches, ``clip`` inserted, ``restored`` turns
    back, with what its LLM calls cost (``calls``, priced): the plan, and
    ``[clip, *kept, *restored]``, the history after it. The clip-archive is
    counted once, with ``counter``: what it is stored with."""
    deleted = [m.id for m in split.to_compress]
    if split.prior_summary is not None:
        deleted.append(split.prior_summary.id)
    after = (*([] if clip is None else [clip]), *split.to_keep, *restored)
    plan = CompactionPlan(
        compaction_id=archive.ids.compaction_id,
        conversation_id=archive.ids.conversation_id,
        new_batches=tuple(archive.fresh),
        superseded=tuple(archive.superseded),
        deleted_message_ids=tuple(deleted),
        clip_archive=clip,
        clip_archive_tokens=None if clip is None else estimate_message_tokens(clip, counter),
        messages_compressed=len(split.to_compress),
        tokens_estimate_before=estimate_history_tokens(history, counter),
        tokens_estimate_after=estimate_history_tokens(after, counter),
        restored_message_ids=tuple(m.id for m in restored),
        usage=calls.usage(),
        summaries_cut=calls.cut_off,
        target_tokens=target if over_target is None else None,
    )
    return Planned(plan, after, over_target, calls.input_tokens, calls.output_tokens)
