"""Grouping the messages to compress into LLM-sized chunks (context-compaction.AC1.2)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from core.domain.messages import ConversationMessage
from core.domain.tokens import DEFAULT_COUNTER, TokenCounter, estimate_message_tokens

Chunk = tuple[ConversationMessage, ...]


def chunk_messages(
    messages: Sequence[ConversationMessage],
    chunk_size: int,
    max_chunk_tokens: int | None = None,
    counter: TokenCounter = DEFAULT_COUNTER,
    min_chunk_tokens: int = 0,
) -> tuple[Chunk, ...]:
    """Split in order into chunks of ``chunk_size`` messages, more while a chunk
    carries under ``min_chunk_tokens`` estimated tokens, and, when
    ``max_chunk_tokens`` is set, never over that many.

    Every request pays the system prompt, the directive and the running summary
    once, whatever it carries: ``chunk_size`` short chat turns (~30 tokens) are
    too little to amortise them (issue 28), so a chunk of short turns grows
    until it carries ``min_chunk_tokens``; a chunk of long turns is closed at
    ``chunk_size`` as before. A last chunk under half ``min_chunk_tokens``
    joins the one before (it would pay the fixed parts for a few turns).
    ``max_chunk_tokens`` wins over all of these.

    A single message over the token budget gets a chunk of its own rather than
    being dropped: losing it silently would be worse than one large request.
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    if max_chunk_tokens is not None and max_chunk_tokens < 1:
        raise ValueError("max_chunk_tokens must be >= 1")
    if min_chunk_tokens < 0:
        raise ValueError("min_chunk_tokens must be >= 0")
    counting = bool(max_chunk_tokens or min_chunk_tokens)
    chunks: list[tuple[Chunk, int]] = []  # (chunk, its estimated tokens)
    current: list[ConversationMessage] = []
    current_tokens = 0
    for message in messages:
        tokens = estimate_message_tokens(message, counter) if counting else 0
        over_budget = max_chunk_tokens is not None and current_tokens + tokens > max_chunk_tokens
        full = len(current) >= chunk_size and current_tokens >= min_chunk_tokens
        if current and (full or over_budget):
            chunks.append((tuple(current), current_tokens))
            current, current_tokens = [], 0
        current.append(message)
        current_tokens += tokens
    if current:
        chunks.append((tuple(current), current_tokens))
    return _short_tail_joined(chunks, min_chunk_tokens, max_chunk_tokens)


def _short_tail_joined(
    chunks: list[tuple[Chunk, int]], min_chunk_tokens: int, max_chunk_tokens: int | None
) -> tuple[Chunk, ...]:
    """The chunks, a last one under half ``min_chunk_tokens`` joined to the one
    before when together they stay within ``max_chunk_tokens``."""
    if len(chunks) >= 2:
        (before, before_tokens), (last, last_tokens) = chunks[-2], chunks[-1]
        joined = before_tokens + last_tokens
        short = 2 * last_tokens < min_chunk_tokens
        if short and (max_chunk_tokens is None or joined <= max_chunk_tokens):
            chunks[-2:] = [((*before, *last), joined)]
    return tuple(chunk for chunk, _ in chunks)


def in_history_order(chunk: Sequence[ConversationMessage], position: Mapping[str, int]) -> Chunk:
    """The chunk's messages back in conversation order.

    Importance decides which messages share a chunk; the LLM still has to read
    them in the order they happened to follow the causal chain.
    """
    return tuple(sorted(chunk, key=lambda message: position[message.id]))


def halve(chunk: Sequence[ConversationMessage], floor: int = 2) -> tuple[Chunk, ...]:
    """The chunk split into halves of at least ``floor`` messages where it can be.

    Used after a timeout: a smaller request is the one lever the compactor has.
    A chunk of ``floor`` messages or fewer comes back whole.
    """
    if len(chunk) <= floor:
        return (tuple(chunk),)
    size = max(floor, -(-len(chunk) // 2))
    return (tuple(chunk[:size]), tuple(chunk[size:]))
