"""Tokens per character, measured: what the provider counted for what was sent.

Every LLM call reports the input tokens the provider billed; the characters of
the request are known. Their decaying average (``TokenRate``: decayed sums of
tokens and of characters, so a large request weighs more than a small one and
old measurements fade as new text is measured) is the deployment model's
tokens per character, and ``CalibratedCounter`` counts a text with it. It
starts at the seeds' characters / 4 (``TokenRate.prior``), which weighs as
``PRIOR_CHARS`` measured characters, so the first request moves it most of the
way and an odd one cannot throw it far.

The provider's count includes its chat template (a few tokens a message), so
the rate does too: a conversation's messages cost that template in the
downstream model's context as well.

Pure: the counter holds the current rate and the compactor's calibration
(``core.compaction.calibration``) moves and stores it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.ports.model import ModelRequest, ModelUsage

#: How much measured text halves the weight of what was measured before it.
HALF_LIFE_CHARS = 200_000
#: The weight of the starting estimate (characters / 4), in measured characters.
PRIOR_CHARS = 2_000
#: A measurement outside these bounds is not a tokenizer's count (a server that
#: reports no usage, or only the uncached part of the prompt): it is ignored.
MIN_TOKENS_PER_CHAR = 0.05
MAX_TOKENS_PER_CHAR = 1.5


@dataclass(frozen=True)
class TokenRate:
    """Decayed sums of measured tokens and characters; ``per_char`` is their ratio."""

    tokens: float
    chars: float
    measured: int = 0  # how many measurements went into it

    @classmethod
    def prior(cls, chars_per_token: float = 4.0) -> TokenRate:
        return cls(tokens=PRIOR_CHARS / chars_per_token, chars=float(PRIOR_CHARS))

    @property
    def per_char(self) -> float:
        return self.tokens / self.chars

    def observed(self, chars: int, tokens: int, half_life: float = HALF_LIFE_CHARS) -> TokenRate:
        """The rate once ``tokens`` were counted for ``chars`` characters; itself
        when the measurement cannot be a tokenizer's (``usable``)."""
        if not usable(chars, tokens):
            return self
        fade = 0.5 ** (chars / half_life)
        return TokenRate(
            tokens=self.tokens * fade + tokens,
            chars=self.chars * fade + chars,
            measured=self.measured + 1,
        )


def usable(chars: int, tokens: int) -> bool:
    """A count a tokenizer could have made of ``chars`` characters."""
    return chars > 0 and MIN_TOKENS_PER_CHAR <= tokens / chars <= MAX_TOKENS_PER_CHAR


def request_chars(request: ModelRequest) -> int:
    """The characters a request sends: its system prompt and every message."""
    return len(request.system or "") + sum(len(m.content) for m in request.messages)


def billed_prompt_tokens(usage: ModelUsage) -> int:
    """Every input token the provider counted, cached or not."""
    return usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens


class CalibratedCounter:
    """A ``TokenCounter`` at the measured rate: ``ceil(len(text) × tokens per char)``.

    ``rate`` moves as calls are measured; a count is taken once, at ingest, and
    stored, so a moved rate changes only the counts taken after it.
    """

    def __init__(self, rate: TokenRate | None = None) -> None:
        self.rate = rate or TokenRate.prior()

    def count(self, text: str) -> int:
        return math.ceil(len(text) * self.rate.per_char)
