"""The compaction strategies' settings and results: what each strategy replaced
and what it freed. Pure data; the strategies themselves are
``core.compaction.strategies`` (one module each).

A strategy cheaper than a summary (``clear_tool_results``, ``offload_oversized``)
replaces a message's content in place (same id, same place, a tool result
still answers its call), archives the full content as a raw turn, and makes no
LLM call; ``summarize`` is the LLM pipeline, last. The strategies run in their
configured order and stop once the history is at or under its target.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

StrategyName = Literal["clear_tool_results", "offload_oversized", "summarize"]
DEFAULT_STRATEGIES: tuple[StrategyName, ...] = (
    "clear_tool_results",
    "offload_oversized",
    "summarize",
)

CLEARED_PREFIX = "[tool result cleared:"
OFFLOADED_PREFIX = "[message offloaded:"
"""How a placeholder starts: a later compaction leaves it alone (its full
content is archived once, by the compaction that replaced it)."""


class ClearToolResultsConfig(BaseModel):
    """``[compaction.clear_tool_results]``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The most recent tool results kept as they are.
    keep_last: int = Field(default=3, ge=0)
    # Tools whose results are never cleared (by tool name).
    exclude_tools: tuple[str, ...] = ()
    # Clear nothing unless this many tokens are freed: each clearing changes the
    # history's prefix (a prompt-cache miss for the agent), so a small one does not pay.
    min_tokens_freed: int = Field(default=0, ge=0)


class StrategyConfig(BaseModel):
    """The strategies of a deployment, per tenant where a ``[[tenants]]`` entry
    names its own, and their settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    strategies: tuple[StrategyName, ...] = DEFAULT_STRATEGIES
    clear_tool_results: ClearToolResultsConfig = ClearToolResultsConfig()
    # A message over this many tokens is archived whole and replaced by a preview.
    max_message_tokens: int = Field(default=20_000, ge=1)
    tenants: Mapping[str, tuple[StrategyName, ...]] = Field(default_factory=dict)

    @field_validator("strategies")
    @classmethod
    def _valid_order(cls, value: tuple[StrategyName, ...]) -> tuple[StrategyName, ...]:
        return checked_order(value)

    def for_tenant(self, tenant: str | None) -> tuple[StrategyName, ...]:
        own = self.tenants.get(tenant) if tenant is not None else None
        return self.strategies if own is None else own


def checked_order(names: tuple[StrategyName, ...]) -> tuple[StrategyName, ...]:
    """``names`` when each strategy appears once and ``summarize``, if present, is last."""
    if not names:
        raise ValueError("at least one strategy is needed")
    if len(set(names)) != len(names):
        raise ValueError(f"a strategy is named twice: {list(names)}")
    if "summarize" in names and names[-1] != "summarize":
        raise ValueError("summarize must be the last strategy (the others are cheaper)")
    return names


class ReplacedMessage(BaseModel):
    """A live message whose content a strategy replaced (its full content archived
    as a raw turn): the new content and its stored token count."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    content: str
    tokens: int = Field(ge=0)
    strategy: StrategyName


class StrategyFreed(BaseModel):
    """What one strategy of a compaction did: messages it touched, tokens it freed
    (estimated, before the history moved on to the next strategy)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    strategy: StrategyName
    messages: int = Field(ge=0)
    tokens_freed: int = Field(ge=0)
