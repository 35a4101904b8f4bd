"""The worker's /metrics: the process's own series, and watchdog exits that a
scrape can see although they are counted just before the process exits."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.metrics import Metrics
from streams.watchdog_exits import WATCHDOG_EXITS_FILE

pytestmark = pytest.mark.unit


def test_metrics_carry_process_and_platform_series() -> None:
    text = Metrics().render().decode()
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"):
        assert f"\n{name}" in text, name
    # Each app's registry is its own: a second one collides with nothing.
    assert "process_cpu_seconds_total" in Metrics().render().decode()


def _exits(metrics: Metrics) -> float:
    value = metrics.registry.get_sample_value("compactor_watchdog_exits_total")
    assert value is not None
    return value


def test_watchdog_exits_survive_the_exit_in_data_dir(tmp_path: Path) -> None:
    first = Metrics(state_dir=tmp_path)
    assert _exits(first) == 0
    first.count_watchdog_exit()
    assert _exits(first) == 1
    assert (tmp_path / WATCHDOG_EXITS_FILE).read_text().strip() == "1"
    second = Metrics(state_dir=tmp_path)  # the next start
    assert _exits(second) == 1
    second.count_watchdog_exit()
    assert _exits(Metrics(state_dir=tmp_path)) == 2


def test_a_damaged_exits_file_is_ignored(tmp_path: Path) -> None:
    (tmp_path / WATCHDOG_EXITS_FILE).write_text("not a number")
    assert _exits(Metrics(state_dir=tmp_path)) == 0
    Metrics().count_watchdog_exit()  # no state_dir: counted in memory only
