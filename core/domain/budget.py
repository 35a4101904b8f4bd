"""When a conversation must be compacted (context-compaction.AC1.1)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

TokenEstimate = Literal["calibrated", "chars"]


class BudgetConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    context_budget: float = Field(default=0.8, gt=0, le=1)
    model_max_tokens: int = Field(default=200_000, ge=1)
    # A compaction leaves at most target_ratio * budget_tokens, so the next
    # message does not put the conversation straight back over budget.
    target_ratio: float = Field(default=0.8, gt=0, le=1)
    # The soft trigger: start compacting once the history exceeds
    # compact_at * budget_tokens, before a reader sees it over the budget
    # (the compaction takes an LLM round trip, and messages keep arriving).
    # None: compact only once the budget itself is exceeded.
    compact_at: float | None = Field(default=None, gt=0, le=1)
    # With compact_at: a conversation between the trigger and the budget is
    # compacted once it has received nothing for this long (between turns, where
    # no reader waits); over the budget it is compacted at once. None: at once.
    idle_seconds: float | None = Field(default=None, gt=0)
    # How a message's tokens are counted when its event carries no token_count:
    # "calibrated", at the tokens per character the provider reported for the
    # summariser's own requests (core.domain.calibration; characters / 4 until a
    # call was measured, and always with the extractive summariser), or "chars",
    # characters / 4. Counted once, at ingest, and stored.
    token_estimate: TokenEstimate = "calibrated"

    @field_validator("compact_at")
    @classmethod
    def _above_target(cls, value: float | None, info: ValidationInfo) -> float | None:
        """A trigger at or under the target would fire again on the history a
        compaction has just left (at most the target), and that command would
        find nothing to compress."""
        target = info.data.get("target_ratio")
        if value is None or target is None or value > target:
            return value
        if target >= 1:
            raise ValueError(
                f"must be greater than [budget].target_ratio ({target}), which leaves no "
                f"room: lower target_ratio or leave compact_at unset"
            )
        example = min(1.0, round(target + 0.05, 2))
        raise ValueError(
            f"must be greater than [budget].target_ratio ({target}) and at most 1, e.g. {example}"
        )

    @property
    def budget_tokens(self) -> int:
        """The largest estimate that still fits: ``floor(context_budget * model_max_tokens)``."""
        return math.floor(self.context_budget * self.model_max_tokens)

    @property
    def target_tokens(self) -> int:
        """What a compaction must get the history down to:
        ``floor(target_ratio * budget_tokens)``."""
        return math.floor(self.target_ratio * self.budget_tokens)

    @property
    def trigger_tokens(self) -> int:
        """A compaction starts once the estimate exceeds this:
        ``floor(compact_at * budget_tokens)``, or ``budget_tokens`` without a
        soft trigger. Never below ``target_tokens`` (``compact_at`` >
        ``target_ratio``), so a compacted history does not trigger again."""
        if self.compact_at is None:
            return self.budget_tokens
        return math.floor(self.compact_at * self.budget_tokens)


def over_budget(token_estimate: int, budget: BudgetConfig) -> bool:
    """The history exceeds the budget (what is reported; see ``compaction_due``)."""
    return token_estimate > budget.context_budget * budget.model_max_tokens


def compaction_due(token_estimate: int, budget: BudgetConfig) -> bool:
    """Should a compaction start: the estimate exceeds the trigger.

    The same as ``over_budget`` without ``compact_at`` (for a whole number of
    tokens, exceeding ``x`` and exceeding ``floor(x)`` are the same thing).
    Everything that decides to compact asks this, so the accounting, the
    reconciler and the processor agree on one threshold."""
    return token_estimate > budget.trigger_tokens


def compaction_due_now(token_estimate: int, budget: BudgetConfig, idle_for: float | None) -> bool:
    """Should a compaction start now, given how long the conversation has been quiet
    (``idle_for`` seconds since its last message; None: unknown, taken as quiet).

    Over the budget: always. Over the trigger only: at once without
    ``idle_seconds``, else once the conversation has paused that long, so the
    compaction runs between turns instead of in the middle of an exchange."""
    if over_budget(token_estimate, budget):
        return True
    if not compaction_due(token_estimate, budget):
        return False
    wait = budget.idle_seconds
    return wait is None or idle_for is None or idle_for >= wait
