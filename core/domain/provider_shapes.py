"""A context in the request shape of a provider: OpenAI Chat Completions or Anthropic Messages.

Both APIs refuse a request whose tool calls and results do not pair up: an
assistant turn that calls tools must be followed by a result for each call,
and a result must answer a call of the turn just before it. A stored history
can break that (a producer that never sent a result, a result whose call was
compacted away), so the history is first read as ``Turn``s in which every
call is answered (``turns_of``); what cannot be paired is kept as text, so
nothing is dropped and nothing is refused. Only calls the conversation ends
with, all still unanswered, stay calls: the platform is running them and
appends their results before it calls the model.

Anthropic also wants one ``system`` string, a first turn from the user and
consecutive turns of one role merged (``anthropic_shape``); OpenAI takes
system messages in place (``openai_shape``). The dictionaries are what the
SDKs' request types (``ChatCompletionMessageParam``, ``MessageParam``)
accept; ``tests/integration/test_context_shapes.py`` sends them through both.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from core.domain.messages import ConversationMessage, ToolCall

#: Opens an Anthropic conversation that would start with an assistant turn.
LEADING_USER_TURN = "[Conversation excerpt follows]"


@dataclass(frozen=True)
class Said:
    role: Literal["system", "user", "assistant"]
    text: str


@dataclass(frozen=True)
class Called:
    """An assistant turn that calls tools; each call is answered by the next turns,
    unless ``pending`` (the conversation ends with these calls)."""

    text: str
    calls: tuple[ToolCall, ...]
    pending: bool = False


@dataclass(frozen=True)
class Answered:
    call: ToolCall
    text: str


Turn = Said | Called | Answered


def turns_of(messages: Sequence[ConversationMessage]) -> list[Turn]:
    """The history as turns whose tool calls and results pair up (see the module)."""
    turns: list[Turn] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        if message.role == "assistant" and message.tool_calls:
            end = index + 1
            while end < len(messages) and messages[end].role == "tool":
                end += 1
            turns += _exchange(message, messages[index + 1 : end], at_end=end == len(messages))
            index = end
            continue
        if message.role == "tool":
            turns.append(Said("user", _result_text(message)))
        else:
            turns.append(Said(message.role, message.content))
        index += 1
    return turns


def _exchange(
    call: ConversationMessage, results: Sequence[ConversationMessage], *, at_end: bool
) -> list[Turn]:
    """One assistant turn's calls and the tool messages after it."""
    calls = call.tool_calls or ()
    if at_end and not results:
        return [Called(call.content, tuple(calls), pending=True)]
    by_id = {c.id: c for c in calls}
    answers: dict[str, ConversationMessage] = {}
    strays: list[Turn] = []
    for result in results:
        owner = result.tool_call_id
        if owner is None and len(calls) == 1:
            owner = calls[0].id  # a result without an id answers the one call before it
        if owner in by_id and owner not in answers:
            answers[owner] = result
        else:
            strays.append(Said("user", _result_text(result)))
    answered = tuple(c for c in calls if c.id in answers)
    unanswered = [c for c in calls if c.id not in answers]
    text = "\n".join([call.content, *(_call_text(c) for c in unanswered)]).strip()
    if not answered:
        return [Said("assistant", text), *strays]
    pairs: list[Turn] = [Answered(c, answers[c.id].content) for c in answered]
    return [Called(text, answered), *pairs, *strays]


def _call_text(call: ToolCall) -> str:
    return f"[called {call.name} {json.dumps(call.arguments, sort_keys=True)}: no result recorded]"


def _result_text(message: ConversationMessage) -> str:
    owner = f" of call {message.tool_call_id}" if message.tool_call_id else ""
    return f"[tool result{owner}] {message.content}"


# -- OpenAI Chat Completions ---------------------------------------------------------


def openai_shape(messages: Sequence[ConversationMessage]) -> list[dict[str, Any]]:
    """``messages`` for ``chat.completions.create``: system messages in place (the
    clip-archive first), assistant ``tool_calls`` and ``tool`` messages."""
    out: list[dict[str, Any]] = []
    for turn in turns_of(messages):
        match turn:
            case Said(role=role, text=text):
                out.append({"role": role, "content": text})
            case Called(text=text, calls=calls):
                out.append(
                    {
                        "role": "assistant",
                        "content": text or None,
                        "tool_calls": [_openai_call(c) for c in calls],
                    }
                )
            case Answered(call=call, text=text):
                out.append({"role": "tool", "tool_call_id": call.id, "content": text})
    return out


def _openai_call(call: ToolCall) -> dict[str, Any]:
    arguments = json.dumps(call.arguments, ensure_ascii=False)
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


# -- Anthropic Messages --------------------------------------------------------------


@dataclass(frozen=True)
class AnthropicShape:
    system: str | None
    messages: list[dict[str, Any]]


def anthropic_shape(messages: Sequence[ConversationMessage]) -> AnthropicShape:
    """``system`` and ``messages`` for ``messages.create``: every system message lifted
    into ``system`` (in order, a blank line apart), ``tool_use`` / ``tool_result``
    blocks, one role at a time, the user first, no empty text block."""
    system: list[str] = []
    rounds: list[tuple[str, list[dict[str, Any]]]] = []
    for turn in turns_of(messages):
        if isinstance(turn, Said) and turn.role == "system":
            if turn.text.strip():
                system.append(turn.text)
            continue
        role, blocks = _anthropic_blocks(turn)
        if not blocks:
            continue
        if rounds and rounds[-1][0] == role:
            rounds[-1][1].extend(blocks)
        else:
            rounds.append((role, blocks))
    if rounds and rounds[0][0] == "assistant":
        rounds.insert(0, ("user", [_text_block(LEADING_USER_TURN)]))
    shaped = [{"role": role, "content": _results_first(blocks)} for role, blocks in rounds]
    return AnthropicShape("\n\n".join(system) or None, shaped)


def _anthropic_blocks(turn: Turn) -> tuple[str, list[dict[str, Any]]]:
    match turn:
        case Said(role=role, text=text):
            return role, [_text_block(text)] if text.strip() else []
        case Called(text=text, calls=calls):
            uses = [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
                for c in calls
            ]
            return "assistant", ([_text_block(text)] if text.strip() else []) + uses
        case Answered(call=call, text=text):
            return "user", [{"type": "tool_result", "tool_use_id": call.id, "content": text}]
    raise AssertionError(turn)  # pragma: no cover (the match is exhaustive)


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _results_first(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A user turn's ``tool_result`` blocks before its text, as the API requires."""
    results = [b for b in blocks if b["type"] == "tool_result"]
    return results + [b for b in blocks if b["type"] != "tool_result"]
