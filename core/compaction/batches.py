"""The conversation's archived batches as one compaction reshapes them.

A compaction adds batches (its summaries), folds some into a deeper one
(re-summarising, fitting) and may replace old ones (recompact, restore);
``LiveArchive`` keeps what the clip-archive will show and what supersedes
what, so the plan says both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from core.domain.clip_archive import (
    ClipArchiveFormatError,
    batch_label,
    is_clip_archive,
    parse_clip_archive,
)
from core.domain.compaction import StoredBatch, SummaryBatch
from core.domain.messages import ConversationMessage
from core.domain.split import HistorySplit


@dataclass(frozen=True)
class CompactionIds:
    """Which conversation a compaction is of, and its id (idempotency key, and the
    prefix of every batch id it writes)."""

    conversation_id: str
    compaction_id: str


@dataclass
class LiveArchive:
    """The live batches as this compaction reshapes them: ``existing`` ones it keeps
    live, ``fresh`` ones it writes, ``live`` what the clip-archive shows."""

    ids: CompactionIds
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


def stored_batches(summaries: Sequence[SummaryBatch], ids: CompactionIds) -> list[StoredBatch]:
    """The summaries as the batches this compaction archives (``{compaction id}:{n}``)."""
    return [
        StoredBatch(
            id=f"{ids.compaction_id}:{index}",
            label=batch_label(ids.conversation_id, batch.end_time),
            conversation_id=ids.conversation_id,
            batch=batch,
            compaction_id=ids.compaction_id,
        )
        for index, batch in enumerate(summaries)
    ]


def live_split(history: Sequence[ConversationMessage]) -> HistorySplit:
    """The history as a recompact or restore sees it: the clip-archive it replaces,
    and every other message kept live."""
    prior = next((m for m in history if is_clip_archive(m)), None)
    kept = tuple(m for m in history if m is not prior)
    return HistorySplit(to_compress=(), to_keep=kept, prior_summary=prior)


def chosen_batch(existing: Sequence[StoredBatch], batch_id: str | None) -> StoredBatch | None:
    """The live batch a restore names (None: the newest)."""
    if batch_id is None:
        return existing[-1] if existing else None
    return next((b for b in existing if b.id == batch_id), None)


def replacements(
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


def cycles_after(prior: ConversationMessage | None, existing: Sequence[StoredBatch]) -> int:
    """The compaction cycles the new clip-archive counts: those before, read from
    the prior clip-archive's header, plus this one.

    Falls back to the compactions visible in archival memory if the header
    cannot be read (a hand-edited or foreign clip-archive).
    """
    if prior is not None:
        try:
            return parse_clip_archive(prior.content).cycles + 1
        except ClipArchiveFormatError:
            pass
    return len({batch.compaction_id for batch in existing}) + 1
