"""The two benchmarks of issue 18 (parts 5 and 6) at a size that runs in a second,
so their logic and the promises they measure stay true in the default run."""

from __future__ import annotations

import looptime
import pytest

from bench.fair_share import Run, run_once
from bench.idle_compaction import replay, simulate
from core.domain.budget import BudgetConfig

pytestmark = pytest.mark.unit


def in_virtual_time(name: str, fair: bool, burst: int) -> Run:
    """One run on an event loop whose clock only moves when every task waits: the
    LLM's 0.2 s are exact, so the machine's load cannot change the latencies."""
    loop = looptime.new_event_loop()
    try:
        return loop.run_until_complete(run_once(name, fair, burst, 5, 0.2))
    finally:
        loop.close()


def test_fair_share_keeps_the_small_tenant_near_its_latency_alone() -> None:
    alone = in_virtual_time("alone", True, 0)
    fifo = in_virtual_time("fifo", False, 300)
    fair = in_virtual_time("fair", True, 300)
    assert fair.p(0.95) <= 2 * alone.p(0.95) < fifo.p(0.95)


def test_idle_seconds_moves_compactions_into_the_pauses() -> None:
    messages = replay(60, 0.25, seed=3)
    plain = BudgetConfig(
        context_budget=0.5, model_max_tokens=8000, target_ratio=0.6, compact_at=0.85
    )
    idle = plain.model_copy(update={"idle_seconds": 10.0})
    before = simulate(messages, plain, 3.0, 15.0)
    after = simulate(messages, idle, 3.0, 15.0)
    assert after.while_idle / after.compactions > before.while_idle / before.compactions
    assert before.seconds_over == 0  # compact_at's room absorbs what arrives meanwhile
