"""What of a long text the work proportional to its length reads.

A turn may hold ``max_content_chars`` (1,000,000 by default): a log pasted in
whole. The steps that read every character of a turn (the specifics ledger,
the extractive summariser) read its head and its tail instead, where a pasted
log's context and its error are, so their cost per turn is bounded however
long the turn.
"""

from __future__ import annotations

READ_HEAD_CHARS = 16_000
READ_TAIL_CHARS = 8_000


def head_and_tail(text: str, head: int = READ_HEAD_CHARS, tail: int = READ_TAIL_CHARS) -> str:
    """``text`` when it has at most ``head + tail`` characters, else its first
    ``head`` and last ``tail`` on two lines (a pattern never matches across the cut)."""
    if len(text) <= head + tail:
        return text
    return f"{text[:head]}\n{text[len(text) - tail :]}"
