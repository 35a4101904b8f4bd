"""The specifics and strategies benchmarks at a size that runs in seconds, so
they keep measuring what they say.

Both had stopped unnoticed: the specifics bench called a store method that had
moved to the store's compactions port, and both stand-in models' summaries were
refused by the gate at every compaction (the strategies bench then printed 270
LLM calls per compaction); their tables in docs/ were no longer reproducible.
"""

from __future__ import annotations

import argparse
import itertools
from collections import Counter

import pytest

from bench import specifics_bench, strategies
from bench.turn_traffic import background_events, compaction_summary

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


async def test_the_strategies_bench_compacts_with_one_call_and_clears_without_any(
    capsys: pytest.CaptureFixture[str],
) -> None:
    await strategies.run(1, 30)
    rows = {
        (cells[1].strip(), cells[2].strip()): cells
        for cells in (line.split("|") for line in capsys.readouterr().out.splitlines())
        if len(cells) > 7 and cells[1].strip() in {"agent", "chat"}
    }
    assert float(rows[("agent", "summarize only")][5]) == 1.0  # calls per compaction
    assert float(rows[("chat", "summarize only")][5]) == 1.0
    assert float(rows[("agent", "pipeline")][5]) == 0.0  # clearing needs no model
    assert "summarize" in rows[("chat", "summarize only")][6]  # tokens were freed


def test_the_turn_bench_background_is_one_wave_or_chats_at_varied_speeds() -> None:
    """``bench.turn_read --mix``: round-robin puts every conversation at the same
    count (they cross their budgets together); varied spreads the counts, each
    conversation's turns still numbered in order."""

    def counts(mix: str) -> Counter[str]:
        events = list(itertools.islice(background_events(20, mix), 4_000))
        seen: dict[str, int] = {}
        for event in events:
            index = int(event.message_id.rsplit("-m", 1)[-1])
            assert index == seen.get(event.conversation_id, -1) + 1
            seen[event.conversation_id] = index
        return Counter(event.conversation_id for event in events)

    assert set(counts("round-robin").values()) == {200}
    varied = counts("varied")
    assert len(varied) == 20 and max(varied.values()) > 2 * min(varied.values())


def test_the_turn_bench_says_whether_compactions_kept_up_meanwhile() -> None:
    first = {
        "compactor_compactions_succeeded_total": 10.0,
        "compactor_compactions_failed_total": 1.0,
        "compactor_commands_issued_total": 20.0,
    }
    last = {
        "compactor_compactions_succeeded_total": 40.0,
        "compactor_compactions_failed_total": 1.0,
        "compactor_compactions_noop_total": 2.0,
        "compactor_commands_issued_total": 70.0,
    }
    summary = compaction_summary(first, last, [8.0, 16.0, 24.0], seconds=10.0)
    assert summary == {"per_s": 3.0, "limit_mean": 16.0, "backlog_grew": 18}
    assert compaction_summary(last, last, [], seconds=5.0)["backlog_grew"] == 0
