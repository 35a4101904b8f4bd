"""The turn-time figure of docs/performance.md, drawn from ``bench.turn_read --json``.

(a) read latency p95 against the number of readers: the context cold (the
    history changed: loaded and fitted) and cached, the whole ``/history`` as the
    baseline, and publish-to-readable (the send to the answer that includes it);
(b) the burst: the largest context handed out over time by ``/history`` and by
    ``/context`` while the LLM compactions are in flight, against the model's
    window and the budget.

    python -m bench.turn_plot turns.json [--out docs/performance-turns.png]

Needs matplotlib (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "performance-turns.png"
KINDS = (
    ("cold", "context, cold", "-"),
    ("cached", "context, cached", "-"),
    ("history", "/history (baseline)", "--"),
    ("publish_to_readable", "publish → readable", ":"),
)


def plot_readers(ax: Any, results: Mapping[str, Any]) -> None:
    rows = sorted(results["turns_by_readers"], key=lambda row: row["readers"])
    readers = [row["readers"] for row in rows]
    for kind, label, style in KINDS:
        ax.plot(readers, [row[kind]["p95"] for row in rows], style, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(readers, [str(n) for n in readers])
    ax.set_xlabel("readers in parallel")
    ax.set_ylabel("p95 ms")
    ax.set_title(
        f"(a) reads at each turn, background {results.get('background_events_per_s', '?')} "
        "events/s",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)


def plot_burst(ax: Any, burst: Mapping[str, Any]) -> None:
    timeline = burst.get("timeline") or []
    seconds = [t for t, _, _ in timeline]
    ax.plot(seconds, [h for _, h, _ in timeline], "--", label="/history (largest)")
    ax.plot(seconds, [c for _, _, c in timeline], "-", label="/context (largest)")
    ax.axhline(burst["window"], color="red", linewidth=1, label="model window")
    ax.axhline(burst["budget"], color="grey", linestyle=":", linewidth=1, label="budget")
    ax.set_xlabel("seconds since the burst began")
    ax.set_ylabel("tokens handed out")
    ax.set_title(
        f"(b) {burst['conversations']} conversations × 300 turns at once, "
        f"provider {burst['llm_latency_s']:g} s",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)


def draw(results: Mapping[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    plot_readers(left, results)
    plot_burst(right, results["burst"])
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.turn_plot", description=__doc__)
    parser.add_argument("results", type=Path, help="JSON of bench.turn_read --json")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("bench.turn_plot needs matplotlib: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    draw(json.loads(args.results.read_text()), args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
