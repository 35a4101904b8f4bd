"""Hypothesis strategies for conversations: plain turns, tool exchanges (some
broken: a call never answered, a result whose call is gone), a clip-archive,
pinned messages when asked."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import strategies as st

from core.domain.messages import ConversationMessage, ToolCall

START = datetime(2026, 1, 1, tzinfo=UTC)
WORDS = st.sampled_from(
    "the deploy failed because payments config error we agreed fix timeout Friday "
    "Alice Berlin 42 requirement decision order invoice #88 refund bug".split()
)
TEXT = st.lists(WORDS, min_size=0, max_size=60).map(" ".join)


@st.composite
def conversations(
    draw: st.DrawFn, *, max_units: int = 30, pins: bool = False
) -> list[ConversationMessage]:
    """``pins``: about one plain turn or tool call in four is pinned."""
    units = draw(
        st.lists(st.sampled_from(["user", "assistant", "tools", "orphan"]), max_size=max_units)
    )
    messages: list[ConversationMessage] = []

    def add(role: str, content: str, **fields: object) -> None:
        messages.append(
            ConversationMessage(
                id=f"m{len(messages):04d}",
                conversation_id="c",
                role=role,  # type: ignore[arg-type]
                content=content,
                created_at=START + timedelta(seconds=len(messages)),
                **fields,  # type: ignore[arg-type]
            )
        )

    if draw(st.booleans()):
        add("system", "[Context Summary] " + draw(TEXT))
        messages[0] = messages[0].as_clip_archive()
    for unit in units:
        pinned = pins and draw(st.integers(0, 3)) == 0
        if unit in ("user", "assistant"):
            add(unit, draw(TEXT), pinned=pinned)
        elif unit == "orphan":
            add("tool", draw(TEXT), tool_call_id=f"gone-{len(messages)}")
        else:
            calls = tuple(
                ToolCall(id=f"call-{len(messages)}-{n}", name="lookup", arguments={"q": draw(TEXT)})
                for n in range(draw(st.integers(1, 3)))
            )
            add("assistant", draw(TEXT), tool_calls=calls, pinned=pinned)
            indices = st.sampled_from(range(len(calls)))
            answered = draw(st.lists(indices, unique=True, max_size=len(calls)))
            for index in answered:
                add("tool", draw(TEXT), tool_call_id=calls[index].id)
    return messages
