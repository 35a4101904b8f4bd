"""The throughput figure of docs/performance.md, drawn from the benchmarks' JSON.

(a) accounting: events/s against ``[service].accounting_batch_max``, one
    line per run shape (events over conversations), with that shape's Faust
    no-op floor measured in the same run as a dashed horizontal line, the P1
    bar (0.5 × the floor) dotted, and the two-worker scale-out as a star;
    from ``python -m bench.accounting_throughput --json FILE``.
(b) compaction: p50 latency (solid, left axis) and compactions/s (dashed,
    right axis) against ``max_concurrent_compactions``, one colour per LLM
    delay; from ``bench.compaction_latency``'s JSON, or any JSON list of
    ``{"max_concurrent", "llm_ms", "p50_ms", "compactions_per_s"}`` objects
    (optionally ``"phase"``; a dict holding such a list under ``latency``, ``rows``,
    ``results``, ``drains`` or ``scenarios`` works too).

    python -m bench.plot --accounting acct.json --latency latency.json \\
        [--out docs/performance-throughput.png]

Needs matplotlib (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "performance-throughput.png"
LIST_KEYS = ("latency", "rows", "results", "drains", "scenarios", "runs")


def load(path: str | None) -> Any:
    if not path:
        return None
    return json.loads(Path(path).read_text())


def plain_ticks(ax: Any, values: Iterable[float]) -> None:
    """Ticks at the measured x values, written as plain numbers on a log axis."""
    from matplotlib.ticker import NullFormatter, NullLocator

    ticks = sorted(set(values))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])


def minor_label(value: float, _: object) -> str:
    """Label the 2× and 5× minor ticks of a log axis (a narrow range has no major one)."""
    digits = f"{value:.0f}"
    return f"{value:,.0f}" if digits[0] in "25" and set(digits[1:]) <= {"0"} else ""


# --------------------------------------------------------------------------- (a)


def plot_accounting(ax: Any, data: Mapping[str, Any] | None) -> None:
    ax.set_title("(a) accounting throughput, one worker")
    if not data or not data.get("shapes"):
        ax.text(0.5, 0.5, "no accounting data", ha="center", va="center", transform=ax.transAxes)
        return
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
    xs_all: list[float] = []
    top: dict[float, float] = {}  # the highest rate at each batch_max, over the shapes
    for shape in data["shapes"]:
        for w in shape["workers"]:
            x = w["accounting_batch_max"] or 1
            top[x] = max(top.get(x, 0.0), w["events_per_s"])
    for n, shape in enumerate(data["shapes"]):
        colour = colours[n % len(colours)]
        name = f"{shape['events']:,} events / {shape['conversations']:,} conversations"
        points = sorted(
            (w["accounting_batch_max"] or 1, w["events_per_s"], w.get("table_writes_per_event"))
            for w in shape["workers"]
        )
        if points:
            xs = [p[0] for p in points]
            xs_all.extend(xs)
            ax.plot(xs, [p[1] for p in points], "o-", color=colour, label=f"worker, {name}")
            for x, y, writes in points:
                if writes is not None:
                    ax.annotate(
                        f"{writes:.3g} writes/event",
                        (x, y),
                        textcoords="offset points",
                        # the top point's label above, the others' below: apart
                        xytext=(4, 6) if y >= top[x] else (4, -12),
                        fontsize=7,
                        color=colour,
                    )
        floor = shape.get("floor")
        if floor:
            # both runs of the floor (before and after the sweep) where the JSON has them
            rate = shape.get("floor_rate") or floor["events_per_s"]
            ax.axhline(
                rate, color=colour, linestyle="--", linewidth=1, label=f"Faust no-op floor, {name}"
            )
            p1 = "P1 bar: 0.5 × floor" if n == 0 else None
            ax.axhline(0.5 * rate, color=colour, linestyle=":", linewidth=1, label=p1)
    for scale in data.get("scale_out", []):
        x = scale.get("accounting_batch_max") or 1
        xs_all.append(x)
        n = scale.get("workers", 1)
        ax.plot(
            [x],
            [scale["events_per_s"]],
            "*",
            markersize=13,
            color="black",
            markerfacecolor="black" if n > 1 else "none",
            label=f"{n} worker{'s' if n > 1 else ''}, scale-out run (same CPUs)",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(minor_label))
    if xs_all:
        ax.set_xlim(min(xs_all) / 1.6, max(xs_all) * 1.6)
        plain_ticks(ax, xs_all)
    ax.set_xlabel("[service].accounting_batch_max (events per accounted group)")
    ax.set_ylabel("message events / s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    caption = (
        f"{data.get('date', '')}, {data.get('cpus', '?')} CPUs, store {data.get('store', '?')}"
    )
    ax.set_title(f"(a) accounting throughput\n{caption}", fontsize=10)


# --------------------------------------------------------------------------- (b)


def latency_rows(data: Any) -> list[Mapping[str, Any]]:
    """The list of scenario dicts, wherever the file keeps it."""
    if isinstance(data, list):
        return [row for row in data if isinstance(row, Mapping)]
    if isinstance(data, Mapping):
        for key in LIST_KEYS:
            if isinstance(data.get(key), list):
                return latency_rows(data[key])
    return []


def _number(row: Mapping[str, Any], *names: str) -> float | None:
    for name in names:
        value = row.get(name)
        if isinstance(value, int | float):
            return float(value)
    return None


def series(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[float, float, float | None]]]:
    """{label: [(max_concurrent, p50 ms, compactions/s)]}, by LLM delay (and phase)."""
    out: dict[str, list[tuple[float, float, float | None]]] = {}
    for row in rows:
        slots = _number(row, "max_concurrent", "max_concurrent_compactions")
        p50 = _number(row, "p50_ms", "p50")
        if slots is None or p50 is None:
            continue
        llm = _number(row, "llm_ms", "latency_ms")
        label = f"LLM {llm:g} ms" if llm is not None else "compactions"
        if row.get("phase"):
            label += f", {row['phase']}"
        out.setdefault(label, []).append(
            (slots, p50, _number(row, "compactions_per_s", "rate", "per_s"))
        )
    return {label: sorted(points) for label, points in out.items()}


def plot_latency(ax: Any, data: Any) -> None:
    ax.set_title("(b) compaction latency and rate vs concurrency")
    lines = series(latency_rows(data))
    if not lines:
        ax.text(
            0.5, 0.5, "no compaction-latency data", ha="center", va="center", transform=ax.transAxes
        )
        return
    rate_ax = ax.twinx()
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    for n, (label, points) in enumerate(lines.items()):
        colour = colours[n % len(colours)]
        xs = [p[0] for p in points]
        ax.plot(xs, [p[1] for p in points], "o-", color=colour, label=f"p50, {label}")
        rated = [(p[0], p[2]) for p in points if p[2] is not None]
        if rated:
            rate_ax.plot(
                [r[0] for r in rated],
                [r[1] for r in rated],
                "s--",
                color=colour,
                alpha=0.7,
                label=f"compactions/s, {label}",
            )
    ax.set_xscale("log", base=2)
    plain_ticks(ax, [p[0] for points in lines.values() for p in points])
    # p50 spans ~30 ms (serial, no LLM delay) to seconds (bursts queued behind few slots)
    from matplotlib.ticker import FuncFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(minor_label))
    rate_ax.set_ylim(bottom=0)
    ax.set_xlabel("[service].max_concurrent_compactions")
    ax.set_ylabel("p50 latency, ms (solid, log scale)")
    rate_ax.set_ylabel("compactions / s (dashed)")
    ax.grid(True, which="both", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    more, more_labels = rate_ax.get_legend_handles_labels()
    # below the axes: inside, it hid the curves' left ends
    ax.legend(
        handles + more,
        labels + more_labels,
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        ncol=2,
    )
    if isinstance(data, Mapping) and data.get("date"):
        bursts = {
            int(n)
            for row in latency_rows(data)
            if row.get("phase") == "burst"
            for n in [row.get("n", 0)]
        }
        size = f"; bursts of {', '.join(map(str, sorted(bursts)))} conversations" if bursts else ""
        ax.set_title(
            "(b) compaction latency and rate vs concurrency\n"
            f"{data['date']}, {data.get('cpus', '?')} CPUs{size}",
            fontsize=10,
        )


# --------------------------------------------------------------------------- main


def draw(accounting: Any, latency: Any, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5))
    plot_accounting(left, accounting)
    plot_latency(right, latency)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120, bbox_inches="tight")  # keeps the legend below panel (b)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.plot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--accounting", help="JSON of bench.accounting_throughput --json")
    parser.add_argument("--latency", help="JSON of the compaction-latency benchmark")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if not args.accounting and not args.latency:
        parser.error("give --accounting and/or --latency")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("bench.plot needs matplotlib: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    draw(load(args.accounting), load(args.latency), args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
