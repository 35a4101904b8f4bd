"""Token estimates.

The seeds use ``ceil(len(text) / 4)``; it is cheap, monotone and close enough
for budget decisions. A model-specific counter can replace it through the
``TokenCounter`` protocol without touching the pipeline.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Protocol

from core.domain.messages import ConversationMessage


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...


class CharRatioTokenCounter:
    """``ceil(len(text) / chars_per_token)``, the seeds' heuristic."""

    def __init__(self, chars_per_token: float = 4.0) -> None:
        if chars_per_token <= 0:
            raise ValueError("chars_per_token must be > 0")
        self.chars_per_token = chars_per_token

    def count(self, text: str) -> int:
        return math.ceil(len(text) / self.chars_per_token)


DEFAULT_COUNTER: TokenCounter = CharRatioTokenCounter()


def estimate_tokens(text: str, counter: TokenCounter = DEFAULT_COUNTER) -> int:
    return counter.count(text)


def message_text_for_estimate(message: ConversationMessage) -> str:
    """Everything the model will read for this message, tool-call payloads included.

    Tool calls can dwarf the visible content (large JSON arguments), so leaving
    them out would let a conversation sail past its budget unnoticed.
    """
    if not message.tool_calls:
        return message.content
    payload = json.dumps(
        [call.model_dump(mode="json") for call in message.tool_calls],
        separators=(",", ":"),
        sort_keys=True,
    )
    return message.content + payload


def estimate_message_tokens(
    message: ConversationMessage, counter: TokenCounter = DEFAULT_COUNTER
) -> int:
    return counter.count(message_text_for_estimate(message))


def estimate_history_tokens(
    history: Iterable[ConversationMessage], counter: TokenCounter = DEFAULT_COUNTER
) -> int:
    return sum(estimate_message_tokens(m, counter) for m in history)
