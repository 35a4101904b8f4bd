"""Pinned messages survive compactions verbatim, and pinned content alone over the
budget is said (a metric, a log line naming the conversation), not dropped."""

from __future__ import annotations

import logging

import pytest

from streams.worker.processor import Compacted, Noop
from tests.support.metrics_text import sample
from tests.unit.worker.harness import harness, over_budget, words

pytestmark = pytest.mark.unit


async def test_a_pinned_message_survives_several_compactions_in_place() -> None:
    h = harness()
    command = await over_budget(h)
    oldest = min((row.seq, k) for k, row in h.store.messages.items() if k[0] == "c1")[1]
    assert await h.store.compactions.set_pinned(*oldest, True)
    original = h.store.messages[oldest].message
    assert isinstance(await h.components.processor.compact(command), Compacted)
    for round_ in range(3):  # more messages, more compactions
        await h.control(h.completions()[-1])
        for i in range(8):
            await h.message(100 + 10 * round_ + i, words(20, f"more{round_}-{i}-"))
        outcome = await h.components.processor.compact(h.commands()[-1])
        assert isinstance(outcome, Compacted)
    assert len(h.store.applied) == 4
    assert h.store.messages[oldest].message == original  # verbatim, still live


async def test_pinned_content_alone_over_the_budget_is_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = harness()
    command = await over_budget(h)
    for _, message_id in [k for k in h.store.messages if k[0] == "c1"]:
        assert await h.store.compactions.set_pinned("c1", message_id, True)
    with caplog.at_level(logging.WARNING, logger="compactor.worker"):
        outcome = await h.components.processor.compact(command)
    assert isinstance(outcome, Noop)  # nothing it may compress
    assert sample(h.components.metrics, "compactor_pinned_over_budget_total") == 1
    assert any("c1" in r.getMessage() and "pinned" in r.getMessage() for r in caplog.records)
    assert all(row.message.pinned for row in h.store.messages.values())
