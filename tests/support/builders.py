"""Hand-written builders for test histories."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from core.domain.messages import ConversationMessage, Role, ToolCall

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def message(
    index: int,
    role: Role = "user",
    content: str | None = None,
    *,
    conversation_id: str = "conv-1",
    tool_calls: Sequence[ToolCall] | None = None,
    tool_call_id: str | None = None,
    id_prefix: str = "m",
) -> ConversationMessage:
    return ConversationMessage(
        id=f"{id_prefix}{index:05d}",
        conversation_id=conversation_id,
        role=role,
        content=f"message {index}" if content is None else content,
        tool_calls=tuple(tool_calls) if tool_calls else None,
        tool_call_id=tool_call_id,
        created_at=T0 + timedelta(seconds=index),
    )


def history(
    n: int, *, conversation_id: str = "conv-1", start: int = 0
) -> list[ConversationMessage]:
    """Alternating user/assistant turns with distinct content."""
    roles: tuple[Role, Role] = ("user", "assistant")
    return [
        message(i, roles[i % 2], conversation_id=conversation_id) for i in range(start, start + n)
    ]
