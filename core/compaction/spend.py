"""What one compaction's LLM calls cost: added up as the summariser calls the model,
priced at the deployment's prices (``[usage].prices``) when the plan is written
(``core.compaction.writes``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from core.domain.usage import LlmUsage, ModelPrice

EXTRACTIVE = "extractive"  # the offline summariser's name: not an LLM


@dataclass
class LlmSpend:
    """One compaction's LLM spend, and how many answers the provider had given
    (to anyone) when this compaction's calls first failed. ``summarizer`` and
    ``model`` start as the summariser's (a compaction that made no call names it
    too); ``fallback``: the calls are the fallback summariser's (a tenant's LLM
    budget is spent)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    calls: int = 0
    summarizer: str | None = None  # the provider that answered
    model: str | None = None
    answers_at_first_failure: int | None = None
    tenant: str | None = None  # whose turn for a guard slot these calls take
    prices: Mapping[str, ModelPrice] = field(default_factory=dict)
    fallback: bool = False
    # Answers the provider cut at ``max_tokens`` (stop reason ``max_tokens`` or
    # ``length``): the gate refuses a plan built on one (``cut_off``).
    cut_off: int = 0

    def usage(self) -> LlmUsage:
        """The spend as the compactions table records it, priced."""
        summarizer = self.summarizer or EXTRACTIVE
        if summarizer == EXTRACTIVE:
            # No LLM: nothing billed, nothing against a tenant's budget (its own
            # word counts are no provider's tokens).
            usage = LlmUsage(summarizer=summarizer, model=self.model or EXTRACTIVE)
        else:
            usage = LlmUsage(
                summarizer=summarizer,
                model=self.model or EXTRACTIVE,
                calls=self.calls,
                input_tokens=self.input_tokens,
                output_tokens=self.output_tokens,
                cache_read_tokens=self.cache_read_tokens,
                cache_write_tokens=self.cache_write_tokens,
            )
        priced = usage.priced(self.prices)
        return priced.model_copy(update={"fallback": True}) if self.fallback else priced
