"""When a conversation must be compacted (context-compaction.AC1.1)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from core.messages import ConversationMessage
from core.tokens import DEFAULT_COUNTER, TokenCounter, estimate_history_tokens


class BudgetConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    context_budget: float = Field(default=0.8, gt=0, le=1)
    model_max_tokens: int = Field(default=200_000, ge=1)
    # A compaction leaves at most target_ratio * budget_tokens, so the next
    # message does not put the conversation straight back over budget.
    target_ratio: float = Field(default=0.8, gt=0, le=1)

    @property
    def budget_tokens(self) -> int:
        """The largest estimate that still fits: ``floor(context_budget * model_max_tokens)``."""
        return math.floor(self.context_budget * self.model_max_tokens)

    @property
    def target_tokens(self) -> int:
        """What a compaction must get the history down to:
        ``floor(target_ratio * budget_tokens)``."""
        return math.floor(self.target_ratio * self.budget_tokens)


def over_budget(token_estimate: int, budget: BudgetConfig) -> bool:
    return token_estimate > budget.context_budget * budget.model_max_tokens


def needs_compaction(
    history: Iterable[ConversationMessage],
    budget: BudgetConfig,
    counter: TokenCounter = DEFAULT_COUNTER,
) -> bool:
    return over_budget(estimate_history_tokens(history, counter), budget)
