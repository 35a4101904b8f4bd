"""What a compaction's LLM calls cost: tokens by kind, the summariser, dollars.

Pure: the price table comes from configuration (``[usage].prices``), the token
counts from the provider's answers. A model without a price costs nothing here
(``cost_usd`` None, "unknown"), which is said rather than guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date

from pydantic import BaseModel, ConfigDict, Field

TOKENS_PER_PRICE_UNIT = 1_000_000


class ModelPrice(BaseModel):
    """USD per million tokens, by kind, as the provider bills them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    # Prompt caching: reading a cached prefix, and writing one (Anthropic bills
    # writes above the input price; OpenAI has no write price, so 0 = input's).
    cache_read: float | None = Field(default=None, ge=0)
    cache_write: float | None = Field(default=None, ge=0)


#: Published list prices (USD per million tokens) of the default models; a
#: deployment with another model or a negotiated price sets ``[usage].prices``.
DEFAULT_PRICES: dict[str, ModelPrice] = {
    "claude-haiku-4-5": ModelPrice(input=1.0, output=5.0, cache_read=0.1, cache_write=1.25),
    "gpt-4o-mini": ModelPrice(input=0.15, output=0.6, cache_read=0.075),
    "extractive": ModelPrice(input=0.0, output=0.0),
}


class LlmUsage(BaseModel):
    """One compaction's LLM spend: what the compactions table and the
    clip-archive event record."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    summarizer: str = "extractive"  # the provider that wrote the summaries
    model: str = "extractive"
    calls: int = Field(default=0, ge=0)
    input_tokens: int = Field(default=0, ge=0)  # billed at the input price
    output_tokens: int = Field(default=0, ge=0)
    cache_read_tokens: int = Field(default=0, ge=0)
    cache_write_tokens: int = Field(default=0, ge=0)
    cost_usd: float | None = Field(default=None, ge=0)  # None: no price for the model
    # The tenant's LLM budget for the day was spent: the fallback summariser wrote it.
    fallback: bool = False

    @property
    def total_tokens(self) -> int:
        """Every token the provider processed: what a tenant's daily budget counts."""
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
        )

    def priced(self, prices: Mapping[str, ModelPrice]) -> LlmUsage:
        return self.model_copy(update={"cost_usd": cost_of(self, prices.get(self.model))})


def cost_of(usage: LlmUsage, price: ModelPrice | None) -> float | None:
    """USD of ``usage`` at ``price`` (None without a price)."""
    if price is None:
        return None
    cache_read = price.cache_read if price.cache_read is not None else price.input
    cache_write = price.cache_write if price.cache_write is not None else price.input
    dollars = (
        usage.input_tokens * price.input
        + usage.output_tokens * price.output
        + usage.cache_read_tokens * cache_read
        + usage.cache_write_tokens * cache_write
    ) / TOKENS_PER_PRICE_UNIT
    return round(dollars, 9)


def billed_input_tokens(usage: LlmUsage, price: ModelPrice | None = None) -> float:
    """Input tokens as the bill counts them, in full-price input tokens: a cache
    read or write costs its price's share of an input token's."""
    price = price or DEFAULT_PRICES["claude-haiku-4-5"]
    if price.input == 0:
        return float(usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens)
    read = (price.cache_read if price.cache_read is not None else price.input) / price.input
    write = (price.cache_write if price.cache_write is not None else price.input) / price.input
    return usage.input_tokens + usage.cache_read_tokens * read + usage.cache_write_tokens * write


class UsageDay(BaseModel):
    """One tenant's compactions on one UTC day, summed (``compactor usage``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant_id: str | None
    day: date
    compactions: int
    llm_calls: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: float
    fallback_compactions: int = 0  # compactions a spent budget sent to the extractive summariser
    # Compactions that spent LLM tokens and then failed (their spend is in the sums).
    failed_compactions: int = 0
