"""``TokenRates``: each model's measured tokens per character, kept across restarts;
the last rate saved is the one read back, per (provider, model)."""

from __future__ import annotations

from typing import Any

from core.domain.calibration import TokenRate


async def test_a_saved_rate_is_read_back_per_provider_and_model(store: Any) -> None:
    rates = store.calibration
    assert await rates.token_rate("openai", "gpt-x") is None
    first = TokenRate(tokens=1_000.0, chars=4_400.0, measured=3)
    await rates.save_token_rate("openai", "gpt-x", first)
    await rates.save_token_rate("anthropic", "gpt-x", TokenRate(tokens=9.0, chars=10.0))
    assert await rates.token_rate("openai", "gpt-x") == first
    later = TokenRate(tokens=1_200.5, chars=5_000.25, measured=4)
    await rates.save_token_rate("openai", "gpt-x", later)
    assert await rates.token_rate("openai", "gpt-x") == later
    assert await rates.token_rate("openai", "gpt-y") is None
    assert await rates.token_rate("anthropic", "gpt-x") == TokenRate(tokens=9.0, chars=10.0)
