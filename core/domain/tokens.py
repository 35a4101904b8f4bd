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


#: A producer's ``token_count`` is kept within this band of the service's own
#: estimate of the same message (``reported_tokens``).
REPORTED_FLOOR_DIVISOR = 4
REPORTED_CEILING_FACTOR = 64
REPORTED_CEILING_SLACK = 256


def reported_tokens(reported: int, estimate: int) -> int:
    """A producer's ``token_count`` clamped to ``[ceil(estimate/4), 64 x estimate + 256]``.

    The floor: no tokenizer packs 16 characters into one token, so a count under a
    quarter of the characters/4 estimate is wrong or hostile; ``0`` used to turn
    the conversation's compaction off. The ceiling is loose on purpose: a provider
    counts what the text estimate misses (a message's framing, several tokens for
    one emoji or CJK character, a document it read), and an over-count only makes
    the producer's own conversation compact sooner, paid from its own tenant's
    budget; the ceiling stops the absurd (a count near the integer limit)."""
    floor = -(-estimate // REPORTED_FLOOR_DIVISOR)
    ceiling = estimate * REPORTED_CEILING_FACTOR + REPORTED_CEILING_SLACK
    return min(max(reported, floor), ceiling)


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
