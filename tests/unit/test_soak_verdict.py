"""The long run's verdict (``bench/soak.py``) on made-up samples: a leak fails it,
a worker's restart, connections coming and going and tables growing with the
data do not; and its traffic keeps tool call/result pairs whole."""

from __future__ import annotations

from typing import Any

import pytest

from bench.soak import Fault, Limits, Plan, SoakReport, Traffic, judge
from tests.chaos.workload import tool_pairs

pytestmark = pytest.mark.unit

PLAN = Plan(minutes=20, rate=100, conversations=50, fault_every=300, sample_every=10)
MiB = 1024 * 1024


def _tables(produced: int, live_bytes: int, per_message: float = 2000.0) -> dict[str, Any]:
    archived = int(produced * per_message)
    return {
        "messages": {"total": live_bytes, "heap": live_bytes // 2, "index": live_bytes // 2},
        "archived_messages": {"total": archived, "heap": archived // 2, "index": archived // 2},
    }


def _samples(
    *, rss_leak_mib_per_min: float = 0.0, fd_leak_per_min: float = 0.0, bloat: float = 0.0
) -> list[dict[str, Any]]:
    samples = []
    for i in range(121):
        t = i * 10.0
        produced = int(t * PLAN.rate)
        # w1 is killed at 300 s and back at 302 s: a new pid, starting low.
        pid1 = 100 if t < 300 else 101
        since = t if t < 300 else t - 302
        workers = {
            "w1": {
                "pid": pid1,
                "rss_mib": 90 + min(since, 60) / 6 + rss_leak_mib_per_min * since / 60,
                "fds": 30 + (i % 3) * 4 + int(fd_leak_per_min * since / 60),
            },
            "w2": {"pid": 200, "rss_mib": 100.0 + (i % 2), "fds": 32 + (i % 4) * 3},
        }
        samples.append(
            {
                "t": t,
                "produced": produced,
                "workers": workers,
                "lag": 400 if i % 30 == 1 else 20 + i % 5,
                "over_budget": 3,
                "tables": _tables(
                    produced, 8 * MiB + int(bloat * t * 40_000), 2000.0 * (1 + bloat * t / 600)
                ),
            }
        )
    return samples


def _report(samples: list[dict[str, Any]], invariants_ok: bool = True) -> SoakReport:
    faults = [
        Fault("worker_kill9", 300, 301, lag_back_after=8.0),
        Fault("postgres_restart", 600, 608, lag_back_after=12.0),
        Fault("broker_restart", 900, 925, lag_back_after=20.0),
    ]
    report = SoakReport(
        PLAN, Limits(), samples, faults, 1200.0, {"ok": invariants_ok, "messages_produced": 1}
    )
    report.checks = judge(report)
    return report


def _failed(report: SoakReport) -> list[str]:
    return [c.name for c in report.checks if not c.ok]


def test_steady_run_with_a_restart_passes() -> None:
    report = _report(_samples())
    assert report.ok, [(c.name, c.detail) for c in report.checks if not c.ok]


def test_rss_leak_fails() -> None:
    assert _failed(_report(_samples(rss_leak_mib_per_min=4.0))) == ["rss_mib w1"]


def test_fd_leak_fails() -> None:
    assert _failed(_report(_samples(fd_leak_per_min=2.0))) == ["fds w1"]


def test_bloat_fails_storage() -> None:
    failed = _failed(_report(_samples(bloat=1.0)))
    assert "bytes per message" in failed
    assert "messages table (live context) bounded" in failed


def test_lag_not_back_and_broken_invariants_fail() -> None:
    samples = _samples()
    report = SoakReport(
        PLAN,
        Limits(),
        samples,
        [Fault("llm_storm", 600, 620, lag_back_after=None)],
        1200.0,
        {"ok": False, "violations": {"lost": 3}},
    )
    report.checks = judge(report)
    # Lag never back: no quiet stretch after the fault to fit a line through either.
    assert _failed(report) == ["lag after fault 1 (llm_storm)", "lag between faults", "invariants"]


def test_traffic_keeps_each_tool_result_after_its_call() -> None:
    traffic = Traffic(5, "c", seed=1)
    kept: dict[str, list[dict[str, Any]]] = {}
    for _ in range(400):
        event, skeleton = traffic.next_event()
        kept.setdefault(event["conversation_id"], []).append(skeleton)
        assert len(event["content"]) <= 300
    pairs = [pair for events in kept.values() for pair in tool_pairs(events)]
    assert len(pairs) > 20
    for events in kept.values():
        roles = [e["role"] for e in events]
        for i, role in enumerate(roles):
            if role == "tool":
                assert "tool_calls" in events[i - 1]
