"""From configuration to an optional ``Embedder``."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from core.ports.embedding import Embedder
from core.settings import ConfigError, EmbeddingSettings

log = logging.getLogger("compactor.embedding")

DEFAULT_EMBEDDING_MODELS = {"openai": "text-embedding-3-small", "local": "all-MiniLM-L6-v2"}


def build_embedder(
    settings: EmbeddingSettings, environ: Mapping[str, str] | None = None
) -> Embedder | None:
    env = os.environ if environ is None else environ
    if settings.provider == "none":
        log.info("memory_read: full-text search only ([embedding].provider = none)")
        return None
    model = settings.model or DEFAULT_EMBEDDING_MODELS[settings.provider]
    if settings.provider == "openai":
        from core.adapters.embedding.openai_compat import OpenAICompatEmbedder

        key = env.get(settings.api_key_env)
        if not key and not settings.base_url:
            raise ConfigError(
                f"[embedding].provider = 'openai' needs an API key in {settings.api_key_env} "
                "(or a base_url of a local server)"
            )
        return OpenAICompatEmbedder(model, key or "not-needed", base_url=settings.base_url)
    if model.removeprefix("sentence-transformers/") == DEFAULT_EMBEDDING_MODELS["local"]:
        # numpy only, the model files from a package: no torch.
        from core.adapters.embedding.minilm import MiniLMEmbedder

        return MiniLMEmbedder()
    # Another model: sentence-transformers ([local-embeddings-torch]).
    from core.adapters.embedding.local import LocalSentenceTransformerEmbedder

    return LocalSentenceTransformerEmbedder(model)
