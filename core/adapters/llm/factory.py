"""From configuration to a ``ModelProvider``.

The SDKs' own retries stay off: the compactor owns retry policy, so a 429 is
never retried twice over by two layers.
"""

from __future__ import annotations

import logging

from core.ports.model import ModelProvider
from core.settings import ResolvedModel

log = logging.getLogger("compactor.model")


def build_model_provider(
    resolved: ResolvedModel, *, timeout_seconds: float, prompt_caching: bool = True
) -> ModelProvider:
    if resolved.kind == "anthropic":
        from core.adapters.llm.anthropic import AnthropicProvider

        provider: ModelProvider = AnthropicProvider(
            resolved.api_key or "",
            base_url=resolved.base_url,
            timeout_seconds=timeout_seconds,
            prompt_caching=prompt_caching,
        )
    elif resolved.kind == "openai":
        from core.adapters.llm.openai_compat import OpenAICompatProvider

        provider = OpenAICompatProvider(
            resolved.api_key or "", base_url=resolved.base_url, timeout_seconds=timeout_seconds
        )
    else:
        from core.adapters.llm.extractive import ExtractiveProvider

        provider = ExtractiveProvider()
        log.warning(
            "summariser: extractive (offline, no LLM): %s. Summaries are extracted "
            "sentences, not generated prose.",
            resolved.reason,
        )
        return provider
    log.info("summariser: %s model %s (%s)", resolved.kind, resolved.model, resolved.reason)
    return provider


def build_fallback_provider() -> ModelProvider:
    """The summariser of a tenant whose LLM budget for the day is spent."""
    from core.adapters.llm.extractive import ExtractiveProvider

    return ExtractiveProvider()
