"""Structured summarisation requests (compaction-v2.AC1, AC4).

The summariser gets proper roles instead of one interpolated blob: the
configured prompt as ``system``, the running summary as a system-role message,
the conversation with its own roles, and a fixed directive last. Nothing here
injects a persona: the summariser's voice is whatever the configured prompt
says (compaction-v2.AC4.1).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from core.domain.clip_archive import is_clip_archive
from core.domain.messages import ConversationMessage
from core.ports.model import ModelMessage, ModelRequest

DEFAULT_SYSTEM_PROMPT = (
    "You are summarizing a conversation history to preserve essential context while "
    "compacting it. Create a concise narrative summary that maintains chronological order "
    "and preserves the causal chain of decisions."
)

DEFAULT_DIRECTIVE = """Summarize the conversation above. Follow these priorities:

PRESERVE: Decisions made and their rationale. Tool outcomes (successes and failures). \
User constraints and preferences explicitly stated. Causal chains explaining why decisions \
were made.

CONDENSE: Repetitive exchanges into single statements. Verbose tool output into key \
results. Conversational filler and acknowledgements.

PRIORITIZE: Recent context over older context. Actionable information over historical \
detail. Unresolved questions and pending tasks.

REMOVE: Greetings and small talk. Redundant confirmations. Formatting artifacts.

Output only the summary text as a flowing narrative, not bullet points."""

PREVIOUS_SUMMARY_PREFIX = "Previous summary of conversation:\n"
SUMMARY_BATCH_PREFIX = "Summary batch:\n"
TOOL_RESULT_PREFIX = "[Tool result]: "
SYSTEM_NOTE_PREFIX = "[System message]: "


def _system_field(system_prompt: str | None) -> str:
    # Used as-is: no trimming, no templating (compaction-v2.AC4.3).
    return DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt


def _assistant_text(message: ConversationMessage) -> str:
    """Assistant content plus its tool calls, which are often the substance of the turn."""
    parts = [message.content] if message.content else []
    for call in message.tool_calls or ():
        arguments = json.dumps(call.arguments, separators=(",", ":"), sort_keys=True)
        parts.append(f"[Tool call] {call.name}({arguments})")
    return "\n".join(parts)


def to_model_messages(messages: Sequence[ConversationMessage]) -> list[ModelMessage]:
    """Conversation turns with their roles preserved (compaction-v2.AC1.3).

    Tool output becomes a user message, as the seeds specify. A clip-archive is
    skipped: it reaches the model as the previous summary instead. A genuine
    system message is kept as a labelled user turn, so it is summarised rather
    than lost and never mistaken for summariser instructions. Empty turns are
    dropped because providers reject empty content.
    """
    out: list[ModelMessage] = []
    for message in messages:
        if message.role == "user":
            text, role = message.content, "user"
        elif message.role == "assistant":
            text, role = _assistant_text(message), "assistant"
        elif message.role == "tool":
            text, role = TOOL_RESULT_PREFIX + message.content, "user"
        elif is_clip_archive(message):
            continue
        else:
            text, role = SYSTEM_NOTE_PREFIX + message.content, "user"
        if text.strip():
            out.append(ModelMessage(role=role, content=text))
    return out


def build_summarization_request(
    *,
    system_prompt: str | None,
    previous_summary: str | None,
    messages: Sequence[ConversationMessage],
    model_name: str,
    max_tokens: int,
) -> ModelRequest:
    request_messages: list[ModelMessage] = []
    if previous_summary:  # none, not an empty one (compaction-v2.AC1.5)
        request_messages.append(
            ModelMessage(role="system", content=PREVIOUS_SUMMARY_PREFIX + previous_summary)
        )
    request_messages.extend(to_model_messages(messages))
    request_messages.append(ModelMessage(role="user", content=DEFAULT_DIRECTIVE))
    return ModelRequest(
        system=_system_field(system_prompt),
        messages=tuple(request_messages),
        model=model_name,
        max_tokens=max_tokens,
        temperature=0,
    )


def build_resummarization_request(
    *,
    system_prompt: str | None,
    batch_contents: Sequence[str],
    model_name: str,
    max_tokens: int,
) -> ModelRequest:
    """Same structure for collapsing batches into one (compaction-v2.AC1.6)."""
    request_messages = [
        ModelMessage(role="system", content=SUMMARY_BATCH_PREFIX + content)
        for content in batch_contents
    ]
    request_messages.append(ModelMessage(role="user", content=DEFAULT_DIRECTIVE))
    return ModelRequest(
        system=_system_field(system_prompt),
        messages=tuple(request_messages),
        model=model_name,
        max_tokens=max_tokens,
        temperature=0,
    )
