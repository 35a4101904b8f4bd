"""Faust's conductor holds every record it delivers, of every topic, while its
producer buffer (the table's changelog records) is over ``max_messages``: the
worker sets that to what one table flush writes
(``faust_patches.producer_buffer_holds``), so a flush no longer stops delivery.
Checked on Faust's own ``ProducerBuffer``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from faust.transport.producer import ProducerBuffer

from core.settings import Settings
from streams.bootstrap import build_app
from streams.kafka import faust_patches
from streams.worker.tally_table import FLUSH_STEP, UNLIMITED_FLUSH, largest_flush

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def faust_default() -> Iterator[None]:
    before = ProducerBuffer.max_messages
    yield
    ProducerBuffer.max_messages = before


def holding(records: int) -> tuple[ProducerBuffer, list[int]]:
    """A buffer holding ``records`` unsent records, and the flushes it asks for."""
    buffer = ProducerBuffer()
    buffer.app = SimpleNamespace(conf=SimpleNamespace(producer_threaded=False))  # type: ignore[assignment]
    for n in range(records):
        buffer.pending.put_nowait(n)  # type: ignore[arg-type]
    flushes: list[int] = []

    async def flush_atmost(n: int | None) -> int:
        flushes.append(n or 0)
        return 0

    buffer.flush_atmost = flush_atmost  # type: ignore[method-assign]
    return buffer, flushes


async def test_one_flush_of_the_table_does_not_hold_delivery() -> None:
    faust_patches.producer_buffer_holds(largest_flush(500.0))
    buffer, flushes = holding(1_000)  # 1,000 conversations' entries, one flush
    await buffer.wait_until_ebb()
    assert flushes == []


async def test_past_what_the_table_writes_delivery_still_waits() -> None:
    bound = largest_flush(500.0)
    faust_patches.producer_buffer_holds(bound)
    buffer, flushes = holding(bound + 1)
    await buffer.wait_until_ebb()
    assert flushes == [bound]


def test_the_bound_is_a_flush_at_the_table_write_rate() -> None:
    assert largest_flush(500.0) == 5_000  # MAX_STRETCH_SECONDS x writes per second
    assert largest_flush(1.0) == FLUSH_STEP
    assert largest_flush(0.0) == UNLIMITED_FLUSH  # no rate limit


def test_the_worker_sets_it_when_it_builds_its_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("POSTGRES_DSN", "postgresql://u:p@127.0.0.1:1/db")  # never connected
    ProducerBuffer.max_messages = 100  # Faust's own
    settings = Settings()
    build_app(settings, bootstrap="127.0.0.1:1")
    assert ProducerBuffer.max_messages == largest_flush(settings.service.table_writes_per_second)
