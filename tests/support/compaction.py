"""The compactor's plan applied to a store the way the processor applies it
(``streams.worker.processor.write_plan``), without the events: for tests of
what a compaction leaves in storage."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.compaction.compactor import PipelineCompactor
from core.compaction.factory import create_compactor
from core.domain.clip_archive import is_clip_archive
from core.domain.compaction import CompactionPlan, Failed, Planned, StoredBatch, Unchanged
from core.domain.gate import Rejected
from core.domain.messages import ConversationMessage
from core.domain.tokens import estimate_history_tokens
from core.ports.storage import AlreadyApplied, Storage
from streams.worker.processor import write_plan

_ids = itertools.count(1)


@dataclass(frozen=True)
class Compressed:
    """One compaction planned and applied, as a test reads it: ``history`` is
    what the model now sees (as it was, unless the plan was applied)."""

    history: tuple[ConversationMessage, ...]
    compaction_id: str
    target_tokens: int | None
    plan: CompactionPlan | None = None
    failed: bool = False
    reason: str | None = None
    over_target: bool = False
    already_applied: bool = False
    before: tuple[ConversationMessage, ...] = ()  # the history it was planned from

    @property
    def batches(self) -> tuple[StoredBatch, ...]:
        return () if self.plan is None else self.plan.new_batches

    @property
    def batches_created(self) -> int:
        return len(self.batches)

    @property
    def messages_compressed(self) -> int:
        return 0 if self.plan is None else self.plan.messages_compressed

    @property
    def tokens_estimate_before(self) -> int:
        return self._tokens("tokens_estimate_before")

    @property
    def tokens_estimate_after(self) -> int:
        return self._tokens("tokens_estimate_after")

    @property
    def compressed_message_ids(self) -> tuple[str, ...]:
        if self.plan is None:
            return ()
        deleted = set(self.plan.deleted_message_ids)
        return tuple(m.id for m in self.before if m.id in deleted and not is_clip_archive(m))

    def _tokens(self, which: str) -> int:
        if self.plan is None:
            return estimate_history_tokens(self.history)
        return int(getattr(self.plan, which))


class PlanAndApply:
    def __init__(self, compactor: PipelineCompactor, store: Storage) -> None:
        self.compactor = compactor
        self.store = store

    async def compress(
        self,
        history: Sequence[ConversationMessage],
        conversation_id: str,
        *,
        compaction_id: str | None = None,
    ) -> Compressed:
        """As the processor does: a compaction id already applied is not planned
        again (no LLM spend on a replay), anything else is planned, then applied."""
        found = tuple(history)
        cid = compaction_id or f"cmp-{next(_ids)}"
        target = self.compactor.target_tokens
        if await self.store.compactions.compaction_applied(cid):
            return Compressed(found, cid, target, reason="compaction already applied",
                              already_applied=True)  # fmt: skip
        match await self.compactor.plan(found, conversation_id, compaction_id=cid):
            case Failed(detail=detail):
                return Compressed(found, cid, target, failed=True, reason=detail)
            case Unchanged(reason=reason, over_target=over):
                return Compressed(found, cid, target, reason=reason, over_target=over)
            case Planned() as planned:
                return await self._applied(found, cid, target, planned)

    async def _applied(
        self,
        found: tuple[ConversationMessage, ...],
        cid: str,
        target: int | None,
        planned: Planned,
    ) -> Compressed:
        match await write_plan(self.store.compactions, planned.plan):
            case Failed(detail=detail) | Rejected(detail=detail):  # refused: not applied
                return Compressed(found, cid, target, failed=True, reason=detail)
            case AlreadyApplied():
                return Compressed(found, cid, target, reason="compaction already applied",
                                  already_applied=True)  # fmt: skip
        over = planned.over_target
        return Compressed(planned.history, cid, target, planned.plan, reason=over,
                          over_target=over is not None, before=found)  # fmt: skip

    def __getattr__(self, name: str) -> Any:  # breaker, provider_guard, ...
        return getattr(self.compactor, name)


def applying_compactor(*, store: Any, **options: Any) -> PlanAndApply:
    """``create_compactor(memory=store.archive, **options)``, applied to ``store``."""
    return PlanAndApply(create_compactor(memory=store.archive, **options), store)
