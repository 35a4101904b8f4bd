"""Reading Prometheus text exposition in tests (no client library parsing quirks)."""

from __future__ import annotations

import re

from streams.metrics import Metrics

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        samples.append((name, dict(_LABEL.findall(labels or "")), float(value)))
    return samples


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels`` (0 if none)."""
    return sum(
        value
        for sample, sample_labels, value in parse_samples(text)
        if sample == name and all(sample_labels.get(k) == v for k, v in labels.items())
    )


def label_values(text: str, name: str, label: str) -> dict[str, float]:
    """``{label value: sample value}`` of ``name`` (for failure messages and reasons)."""
    out: dict[str, float] = {}
    for sample, sample_labels, value in parse_samples(text):
        if sample == name and label in sample_labels:
            out[sample_labels[label]] = out.get(sample_labels[label], 0.0) + value
    return out


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    """The sample ``name`` with ``labels`` in ``metrics``' own registry
    (``Metrics.registry``), as ``/metrics`` exposes it; 0 when it has none yet."""
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value
