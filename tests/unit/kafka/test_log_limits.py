"""Repeated library log lines during an outage are held back, and counted."""

from __future__ import annotations

import io
import logging

import pytest
from mode.utils.logging import ExtensionFormatter

from streams.kafka.log_limits import RepeatLimiter, limit_repeats

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_storm_of_one_line_is_cut_to_a_few_per_window_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    logger = logging.getLogger("aiokafka.test-storm")
    limit_repeats(("aiokafka.test-storm",), RepeatLimiter(window_seconds=30, burst=3, clock=clock))
    with caplog.at_level(logging.ERROR, logger="aiokafka.test-storm"):
        for attempt in range(1600):
            clock.now = attempt * 30 / 1600  # 1,600 lines in 30 s, as in the broker outage
            logger.error("Unable connect to node with id %s: %s", 1, "refused 100%")
        clock.now = 31.0
        logger.error("Unable connect to node with id %s: %s", 1, "refused 100%")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4
    assert lines[0] == "Unable connect to node with id 1: refused 100%"
    assert lines[-1] == (
        "Unable connect to node with id 1: refused 100% "
        "[1597 more like this held back in the last 30s]"
    )
    # The worker's formatter (mode's) formats the summary line too; with the
    # arguments left as None it logged "--- Logging error ---" and a traceback
    # instead (seen in the soak's broker restarts, bench/soak.py).
    formatter = ExtensionFormatter(stream=io.StringIO(), fmt="%(message)s")
    assert formatter.format(caplog.records[-1]) == lines[-1]


def test_different_lines_are_limited_separately(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    logger = logging.getLogger("aiokafka.test-separate")
    limit_repeats(("aiokafka.test-separate",), RepeatLimiter(burst=1, clock=clock))
    with caplog.at_level(logging.INFO, logger="aiokafka.test-separate"):
        for _ in range(5):
            logger.error("one %s", "a")
            logger.warning("two")
    assert [r.getMessage() for r in caplog.records] == ["one a", "two"]
