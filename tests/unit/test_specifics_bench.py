"""The specifics benchmark at a size that runs in seconds, so it keeps running.

It had stopped running unnoticed: it called a store method that had moved to
the store's compactions port, and its stand-in model's summaries were all
refused by the gate; the table in docs/memory.md was no longer reproducible.
"""

from __future__ import annotations

import argparse

import pytest

from bench import specifics_bench

pytestmark = pytest.mark.unit


async def test_the_specifics_bench_runs_and_the_ledger_keeps_round_ones_specifics(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = argparse.Namespace(conversations=1, turns=15, ratios=[0.25])
    await specifics_bench.main_async(args)
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines()]
    retention = {
        (cells[1].strip(), cells[2].strip()): float(cells[3])
        for cells in rows
        if len(cells) > 7 and cells[2].strip() in {"0", "0.25"}
    }
    # Right after compaction, the ledger (0.25) states every planted specific.
    assert retention[("extractive", "0.25")] == 1.0
    assert retention[("LLM test server", "0.25")] == 1.0
    assert retention[("LLM test server", "0")] < 1.0  # the stand-in drops them: a real test
