"""The context in OpenAI's and Anthropic's request shapes: whatever the stored
history, the result keeps every message's text and breaks none of the rules
the APIs refuse a request for."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings

from core.domain.messages import ConversationMessage, ToolCall
from core.domain.provider_shapes import LEADING_USER_TURN, anthropic_shape, openai_shape
from tests.unit.domain.conversations import START, conversations

pytestmark = pytest.mark.unit


def message(id: str, role: str, content: str = "", **fields: Any) -> ConversationMessage:
    return ConversationMessage(
        id=id, conversation_id="c", role=role, content=content, created_at=START, **fields
    )


def test_an_exchange_in_openai_shape() -> None:
    call = ToolCall(id="t1", name="lookup", arguments={"order": 88})
    history = [
        message("s", "system", "[Context Summary] earlier").as_clip_archive(),
        message("u", "user", "where is order 88?"),
        message("a", "assistant", "", tool_calls=(call,)),
        message("r", "tool", "shipped", tool_call_id="t1"),
        message("b", "assistant", "It shipped."),
    ]
    assert openai_shape(history) == [
        {"role": "system", "content": "[Context Summary] earlier"},
        {"role": "user", "content": "where is order 88?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"order": 88}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "shipped"},
        {"role": "assistant", "content": "It shipped."},
    ]


def test_an_exchange_in_anthropic_shape() -> None:
    call = ToolCall(id="t1", name="lookup", arguments={"order": 88})
    history = [
        message("s", "system", "[Context Summary] earlier").as_clip_archive(),
        message("a0", "assistant", "Hello."),
        message("u", "user", "where is order 88?"),
        message("a", "assistant", "Checking.", tool_calls=(call,)),
        message("r", "tool", "shipped", tool_call_id="t1"),
        message("u2", "user", "thanks"),
    ]
    shape = anthropic_shape(history)
    assert shape.system == "[Context Summary] earlier"
    assert shape.messages == [
        {"role": "user", "content": [{"type": "text", "text": LEADING_USER_TURN}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
        {"role": "user", "content": [{"type": "text", "text": "where is order 88?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"order": 88}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "shipped"},
                {"type": "text", "text": "thanks"},
            ],
        },
    ]


def test_calls_the_conversation_ends_with_stay_calls() -> None:
    call = ToolCall(id="t9", name="run", arguments={})
    history = [message("u", "user", "run it"), message("a", "assistant", "", tool_calls=(call,))]
    assert openai_shape(history)[-1]["tool_calls"][0]["id"] == "t9"
    assert anthropic_shape(history).messages[-1]["content"][0]["type"] == "tool_use"


def test_broken_exchanges_become_text() -> None:
    call = ToolCall(id="t1", name="lookup", arguments={"q": "x"})
    history = [
        message("r0", "tool", "orphaned result", tool_call_id="gone"),
        message("a", "assistant", "asked", tool_calls=(call,)),
        message("u", "user", "never mind"),
    ]
    shaped = openai_shape(history)
    assert [m["role"] for m in shaped] == ["user", "assistant", "user"]
    assert "orphaned result" in shaped[0]["content"]
    assert "[called lookup" in shaped[1]["content"] and "tool_calls" not in shaped[1]


def texts(history: list[ConversationMessage]) -> list[str]:
    return [m.content for m in history if m.content.strip()]


@settings(max_examples=300)
@given(conversations())
def test_openai_shape_pairs_every_call_and_keeps_every_text(
    history: list[ConversationMessage],
) -> None:
    shaped = openai_shape(history)
    open_calls: set[str] = set()
    for index, item in enumerate(shaped):
        if item["role"] == "tool":
            assert item["tool_call_id"] in open_calls
            open_calls.discard(item["tool_call_id"])
            continue
        assert not open_calls, "a call left unanswered before the next turn"
        if item.get("tool_calls"):
            open_calls = {c["id"] for c in item["tool_calls"]}
            if index == len(shaped) - 1:
                open_calls = set()  # the conversation ends with calls in flight
    dumped = repr(shaped)
    assert all(text in dumped or repr(text)[1:-1] in dumped for text in texts(history))


@settings(max_examples=300)
@given(conversations())
def test_anthropic_shape_alternates_opens_with_the_user_and_pairs_every_tool_use(
    history: list[ConversationMessage],
) -> None:
    shaped = anthropic_shape(history).messages
    if not shaped:
        return
    assert shaped[0]["role"] == "user"
    for before, after in pairwise(shaped):
        assert before["role"] != after["role"]
    for index, item in enumerate(shaped):
        blocks = item["content"]
        assert blocks and all(b["type"] != "text" or b["text"].strip() for b in blocks)
        kinds = [b["type"] for b in blocks]
        assert kinds == sorted(kinds, key=lambda k: k != "tool_result")
        uses = {b["id"] for b in blocks if b["type"] == "tool_use"}
        if uses and index < len(shaped) - 1:
            answered = {
                b["tool_use_id"] for b in shaped[index + 1]["content"] if b["type"] == "tool_result"
            }
            assert uses == answered
        for b in blocks:
            if b["type"] == "tool_result":
                previous = shaped[index - 1]["content"]
                assert b["tool_use_id"] in {u["id"] for u in previous if u["type"] == "tool_use"}
