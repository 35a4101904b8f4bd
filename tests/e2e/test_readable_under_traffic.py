"""Under steady traffic, a message is readable within a fetch of its ack, not 1.5 s.

Why: Faust builds aiokafka's consumer with ``fetch_max_wait_ms=1500``, and
aiokafka leaves partitions whose fetched records are not all taken out of the
next fetch request, one request in flight per broker. Under steady traffic the
request in flight often asked for idle partitions only (changelogs, control,
commands), and the broker held it the full 1.5 s while the new messages waited
behind it: platforms reading at every turn saw publish-to-readable p50 ~120 ms
and p95 ~1.6 s at 300 events/s with four readers (``python -m bench.turn_read
--quick --rate 300``), against ~250 ms p95 with the wait at 100 ms
(``streams.kafka.faust_patches.FETCH_MAX_WAIT_MS``).

Four platforms publish and read their own turns (``through`` with a wait) while
300 events/s flow into 200 other conversations, paced every 10 ms as a real
stream would be.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

import pytest

from tests.e2e.conftest import Conversation, Stack, eventually, ready_worker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

RATE = 300  # background events/s
READERS = 4
TURNS = 15  # per reader
# p90 was 1.60 s with Faust's fetch wait on the quiet machine; 0.20 s with 100 ms
# quiet, 0.96 s with the machine loaded by two other test runs.
BOUND_P90_SECONDS = 1.2


async def paced_traffic(stack: Stack, stop: asyncio.Event) -> int:
    """``RATE`` events/s into 200 conversations, sent every 10 ms; how many were sent."""
    background = [Conversation(f"noise-{n:03d}", "meadow", chars=120) for n in range(200)]
    started_at, sent = time.monotonic(), 0
    while not stop.is_set():
        due = int(RATE * (time.monotonic() - started_at)) - sent
        events = [background[(sent + i) % len(background)].message() for i in range(max(due, 0))]
        await asyncio.gather(*(stack.producer.send(
            stack.names.messages, json.dumps(e).encode(), key=e["conversation_id"].encode()
        ) for e in events))  # fmt: skip
        sent += len(events)
        await asyncio.sleep(0.01)
    return sent


async def turns_of_a_platform(stack: Stack, worker: Any, n: int) -> list[float]:
    """Publish a turn, read the context through it; the seconds from ack to answer."""
    platform = Conversation(f"platform-{n}", "quartz", chars=120)
    waited = []
    for _ in range(TURNS):
        event = platform.message()
        await stack.send(event)
        acked_at = time.monotonic()
        status, body = await worker.get(
            f"/conversations/{platform.id}/context?through={event['message_id']}&wait_ms=5000"
        )
        waited.append(time.monotonic() - acked_at)
        assert status == 200, body
        assert event["message_id"] in [m["id"] for m in body["request"]["messages"]]
    return waited


async def test_a_turn_is_readable_soon_after_its_ack_under_steady_traffic(stack: Stack) -> None:
    worker = await ready_worker(stack)
    stop = asyncio.Event()
    traffic = asyncio.create_task(paced_traffic(stack, stop))
    try:

        async def flowing() -> None:  # the traffic accounted before the first turn
            status, body = await worker.get("/conversations/noise-199/context")
            assert status == 200, body

        await eventually(flowing, timeout=60, what="the background traffic accounted")
        per_reader = await asyncio.gather(
            *(turns_of_a_platform(stack, worker, n) for n in range(READERS))
        )
    finally:
        stop.set()
        sent = await traffic
    waits = sorted(w for waited in per_reader for w in waited)
    p90 = statistics.quantiles(waits, n=10)[-1]
    print(f"background {sent} events; publish-to-readable (s) p50 "
          f"{statistics.median(waits):.3f} p90 {p90:.3f} max {waits[-1]:.3f}")  # fmt: skip
    assert p90 < BOUND_P90_SECONDS, f"p90 {p90:.3f} s: {[round(w, 3) for w in waits]}"
