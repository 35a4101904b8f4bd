"""Never acknowledging a record whose write failed: outages are waited out on the same record."""

from __future__ import annotations

import pytest

from core.ports.publisher import PublisherUnavailable
from streams.dead_letter_headers import DeadLetterHeaders
from tests.support.metrics_text import sample
from tests.unit.worker.harness import NAMES, backed_off, harness

pytestmark = pytest.mark.unit


async def test_a_database_outage_is_waited_out_on_the_same_record() -> None:
    h = harness()
    h.store.fail_times("save_free", 6)
    await h.message(0, "hello there")
    assert h.store.message_ids() == ["c1-m0000"]
    assert h.tally().token_total == 3
    assert len(h.slept) == 6 and backed_off(h.slept)  # backoff, never a give-up
    metrics = h.components.metrics
    assert sample(metrics, "compactor_accounting_retries_total", error_type="StoreUnavailable") == 6
    assert sample(metrics, "compactor_accounting_waiting") == 0
    assert h.components.health.ok
    assert h.publisher.on("dead_letters") == []


async def test_health_reports_the_outage_while_it_lasts() -> None:
    h = harness()
    seen: list[list[dict[str, object]]] = []

    h.while_sleeping = lambda: seen.append(h.components.health.describe())
    h.store.fail_times("totals_of", 1)
    await h.message(0, "hello there")
    (problems,) = seen
    (problem,) = problems
    assert problem["component"] == "accounting"
    assert "outage" in str(problem["detail"]) and "StoreUnavailable" in str(problem["detail"])
    assert h.components.health.ok


async def test_a_record_that_keeps_failing_for_another_reason_is_dead_lettered() -> None:
    h = harness()
    original = h.store._call

    def failing(name: str) -> None:
        if name == "save_free":
            raise ValueError("boom")  # not an outage: a bug, or a record breaking an assumption
        original(name)

    h.store._call = failing  # type: ignore[method-assign]
    await h.message(0, "hello there")
    (letter,) = h.publisher.on("dead_letters")
    headers = DeadLetterHeaders.from_kafka(list(letter.headers))
    assert headers.error_type == "processing_error"
    assert "after 5 attempts: ValueError: boom" in headers.reason
    assert len(h.slept) == 5


async def test_a_revoked_partition_stops_the_wait() -> None:
    h = harness()
    h.store.fail_times("save_free", 1000)
    h.assigned = False
    await h.message(0, "hello there")  # returns: the new owner redoes it
    assert h.store.messages == {} and h.table == {}


async def test_a_failed_dead_letter_send_is_retried_not_dropped() -> None:
    h = harness()
    h.publisher.fail_next = PublisherUnavailable("broker away")
    await h.components.accounting.handle(h.record(NAMES.messages, "c1", b"{not json"))
    (letter,) = h.publisher.on("dead_letters")
    assert letter.value == b"{not json"
    assert sample(h.components.metrics, "compactor_events_in_total", outcome="dead_lettered") == 1
