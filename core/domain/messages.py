"""The conversation message as every layer sees it.

Frozen so that a history handed to the compactor cannot be mutated behind its
back: a failed compaction must be able to return the very objects it got.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[Role, ...] = ("system", "user", "assistant", "tool")


class ToolCall(BaseModel):
    """One tool invocation requested by an assistant turn."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ConversationMessage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1)
    conversation_id: str = Field(min_length=1)
    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: str | None = None
    created_at: AwareDatetime
