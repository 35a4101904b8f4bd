"""Wire events: JSON on Kafka, validated by pydantic, versioned.

Producers outside this service write ``MessageEvent``; everything else is
written by the service itself. ``schema_version`` lets a consumer reject what
it does not understand instead of misreading it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from core.messages import ConversationMessage, Role, ToolCall

MAX_ID_LENGTH = 256
DEFAULT_MAX_CONTENT_CHARS = 1_000_000


class MessageEvent(BaseModel):
    """One chat message, keyed on Kafka by ``conversation_id``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    message_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    conversation_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: str | None = Field(default=None, max_length=MAX_ID_LENGTH)
    created_at: AwareDatetime
    token_count: int | None = Field(
        default=None, ge=0, description="Provider-reported token count; preferred over the estimate"
    )

    def to_message(self) -> ConversationMessage:
        return ConversationMessage(
            id=self.message_id,
            conversation_id=self.conversation_id,
            role=self.role,
            content=self.content,
            tool_calls=self.tool_calls or None,
            tool_call_id=self.tool_call_id,
            created_at=self.created_at,
        )
