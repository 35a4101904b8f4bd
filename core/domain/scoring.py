"""Heuristic importance scoring (compaction-v2.AC3).

Low-scoring messages are compressed first, so the most useful older turns
survive longest. The formula is the seeds' to the letter: role weight times
recency decay, plus content bonuses.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from core.domain.messages import ConversationMessage

DEFAULT_IMPORTANT_KEYWORDS: tuple[str, ...] = (
    "error",
    "fail",
    "bug",
    "fix",
    "decision",
    "agreed",
    "constraint",
    "requirement",
)

LENGTH_BONUS_CAP = 3.0


class ImportanceScoringConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    role_weight_system: float = Field(default=10.0, ge=0)
    role_weight_user: float = Field(default=5.0, ge=0)
    role_weight_assistant: float = Field(default=3.0, ge=0)
    recency_decay: float = Field(default=0.95, gt=0, le=1)
    question_bonus: float = Field(default=2.0, ge=0)
    tool_call_bonus: float = Field(default=4.0, ge=0)
    keyword_bonus: float = Field(default=1.5, ge=0)
    important_keywords: tuple[str, ...] = DEFAULT_IMPORTANT_KEYWORDS
    content_length_weight: float = Field(default=1.0, ge=0)


DEFAULT_SCORING = ImportanceScoringConfig()


def _role_weight(message: ConversationMessage, config: ImportanceScoringConfig) -> float:
    if message.role == "system":
        return config.role_weight_system
    if message.role == "assistant":
        return config.role_weight_assistant
    # A tool result answers the user's request, so it weighs like the user.
    return config.role_weight_user


def score_message(
    message: ConversationMessage,
    index: int,
    total: int,
    config: ImportanceScoringConfig = DEFAULT_SCORING,
) -> float:
    """Score one message at ``index`` of ``total`` (0 = oldest)."""
    if total <= 0 or not 0 <= index < total:
        raise ValueError(f"index {index} out of range for total {total}")
    distance_from_newest = total - 1 - index
    score = _role_weight(message, config) * config.recency_decay**distance_from_newest

    content = message.content
    if "?" in content:
        score += config.question_bonus
    if message.tool_calls:
        score += config.tool_call_bonus
    lowered = content.lower()
    distinct_keywords = {k.lower() for k in config.important_keywords if k}
    score += config.keyword_bonus * sum(1 for k in distinct_keywords if k in lowered)
    score += min(len(content) / 100 * config.content_length_weight, LENGTH_BONUS_CAP)
    return score
