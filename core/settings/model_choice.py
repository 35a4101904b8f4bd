"""Which summariser the worker uses: the configured provider, or with
``provider = "auto"`` the first whose API key is in the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from core.settings.errors import ConfigError
from core.settings.sections import SummarizationSettings

ResolvedKind = Literal["anthropic", "openai", "extractive"]

DEFAULT_MODELS: dict[str, str] = {
    "anthropic": "claude-haiku-4-5",
    "openai": "gpt-4o-mini",
    "extractive": "extractive",
}
DEFAULT_KEY_ENV: dict[str, str] = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}


class ResolvedModel(BaseModel):
    """Which provider the compactor will use, and why (for the start-up log)."""

    model_config = ConfigDict(frozen=True)

    kind: ResolvedKind
    model: str
    api_key: str | None = Field(default=None, repr=False)
    base_url: str | None = None
    reason: str


def resolve_model(
    settings: SummarizationSettings, environ: Mapping[str, str] | None = None
) -> ResolvedModel:
    env = os.environ if environ is None else environ

    def key_for(kind: str) -> tuple[str, str | None]:
        name = settings.api_key_env or DEFAULT_KEY_ENV[kind]
        return name, env.get(name) or None

    def resolved(kind: ResolvedKind, key: str | None, why: str) -> ResolvedModel:
        return ResolvedModel(
            kind=kind,
            model=settings.model or DEFAULT_MODELS[kind],
            api_key=key,
            base_url=settings.base_url,
            reason=why,
        )

    if settings.provider == "extractive":
        return resolved("extractive", None, "provider = extractive in config")
    if settings.provider == "auto":
        for kind in ("anthropic", "openai"):
            name, key = key_for(kind)
            if key:
                return resolved(kind, key, f"{name} is set")
        return resolved(
            "extractive",
            None,
            "no API key configured (set ANTHROPIC_API_KEY or OPENAI_API_KEY to use an LLM)",
        )
    name, key = key_for(settings.provider)
    if key is None and not (settings.provider == "openai" and settings.base_url):
        raise ConfigError(
            f"[summarization].provider = {settings.provider!r} needs an API key in the "
            f"environment variable {name} (or set [summarization].api_key_env)"
        )
    # Local OpenAI-compatible servers (vLLM, llama.cpp, Ollama) accept any key.
    return resolved(settings.provider, key or "not-needed", f"provider = {settings.provider}")
