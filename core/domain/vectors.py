"""What an embedder's answer must be before it is stored or searched with: one
finite vector per text, all of one size, within what pgvector holds."""

from __future__ import annotations

import math

# pgvector's limit for the ``vector`` type.
MAX_VECTOR_DIMS = 16_000


def check_vectors(vectors: list[list[float]], expected: int) -> None:
    if len(vectors) != expected:
        raise ValueError(f"embedder returned {len(vectors)} vectors for {expected} texts")
    dims = {len(v) for v in vectors}
    if len(dims) != 1:
        raise ValueError(f"embedder returned vectors of differing sizes {sorted(dims)}")
    (size,) = dims
    if not 1 <= size <= MAX_VECTOR_DIMS:
        raise ValueError(f"embedding size {size} outside 1..{MAX_VECTOR_DIMS}")
    if not all(math.isfinite(x) for v in vectors for x in v):
        raise ValueError("embedder returned a non-finite component")
