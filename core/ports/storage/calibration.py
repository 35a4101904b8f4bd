"""The measured tokens per character of each provider's model, kept across restarts."""

from __future__ import annotations

from typing import Protocol

from core.domain.calibration import TokenRate


class TokenRates(Protocol):
    """One ``TokenRate`` per (provider, model): what a worker measured last."""

    async def token_rate(self, provider: str, model: str) -> TokenRate | None:
        """The rate saved for the model, or None before any was."""
        ...

    async def save_token_rate(self, provider: str, model: str, rate: TokenRate) -> None:
        """Keep ``rate`` as the model's (the last saved wins: every worker measures
        the same model's tokenizer, so their rates agree)."""
        ...
