"""The deployment model's tokens per character, measured on every LLM call and kept.

``[budget].token_estimate = "calibrated"``: each call's reported input tokens
(cache reads and writes included) against the characters it sent move the
counter's rate (``core.domain.calibration``), so the counts ingest stores for
new messages, and the compactor's estimates, are in the provider's tokens. The
rate is saved after each call that moved it (one upsert beside a call that
takes seconds) and read back when the worker opens, so a restart keeps it; a
save that fails (the store away) is logged and the next call saves again.
Only the deployment's own summariser is measured, never the extractive
fallback, whose counts are this estimate.
"""

from __future__ import annotations

import logging
from typing import Protocol

from core.domain.budget import TokenEstimate
from core.domain.calibration import (
    CalibratedCounter,
    TokenRate,
    billed_prompt_tokens,
    request_chars,
)
from core.ports.model import ModelRequest, ModelUsage
from core.ports.storage import StoreError, TokenRates

log = logging.getLogger("compactor.calibration")


class Calibration:
    """One model's measured rate: ``counter`` counts with it, ``measured`` moves it."""

    def __init__(
        self,
        provider: str,
        model: str,
        store: TokenRates,
        rate: TokenRate | None = None,
    ) -> None:
        self.provider = provider
        self.model = model
        self.counter = CalibratedCounter(rate)
        self._store = store

    @classmethod
    async def opened(cls, provider: str, model: str, store: TokenRates) -> Calibration:
        """The model's calibration as it was last saved (characters / 4 before any)."""
        calibration = cls(provider, model, store, await store.token_rate(provider, model))
        log.info(
            "token estimate: calibrated, %.4f tokens a character for %s/%s (%d calls measured)",
            calibration.counter.rate.per_char,
            provider,
            model,
            calibration.counter.rate.measured,
        )
        return calibration

    @property
    def rate(self) -> TokenRate:
        return self.counter.rate

    async def measured(self, request: ModelRequest, usage: ModelUsage) -> None:
        """``usage`` is what the provider counted for ``request``: the rate moves and
        is saved (an unusable count, such as none, leaves it as it was)."""
        before = self.counter.rate
        self.counter.rate = before.observed(request_chars(request), billed_prompt_tokens(usage))
        if self.counter.rate is before:
            return
        try:
            await self._store.save_token_rate(self.provider, self.model, self.counter.rate)
        except StoreError as error:  # kept in memory; the next measured call saves it
            log.warning("token calibration not saved: %s", error)


class Summariser(Protocol):
    """Which model summarises (``core.settings.ResolvedModel``)."""

    @property
    def kind(self) -> str: ...

    @property
    def model(self) -> str: ...


async def open_calibration(
    token_estimate: TokenEstimate, summariser: Summariser, store: TokenRates
) -> Calibration | None:
    """The summariser's calibration as last saved, with ``[budget].token_estimate =
    "calibrated"`` and an LLM summariser (the extractive one reports this very
    estimate: nothing to measure); None otherwise."""
    if token_estimate != "calibrated" or summariser.kind == "extractive":
        return None
    return await Calibration.opened(summariser.kind, summariser.model, store)
