"""What a waiting reader learns from ingest: a store wakes it, a store between
its look at the store and its wait is not slept through, and which conversations
this worker stored lately (bounded by time)."""

from __future__ import annotations

import asyncio

import pytest

from streams.worker.ingest_notices import IngestNotices

pytestmark = pytest.mark.unit


async def test_a_store_wakes_the_readers_of_that_conversation_only() -> None:
    notices = IngestNotices()
    woken = asyncio.create_task(notices.wait("t/a", 30))
    other = asyncio.create_task(notices.wait("t/b", 0.05))
    # after both tasks' first steps (call_soon runs in order): both are waiting
    asyncio.get_running_loop().call_soon(notices.stored, {"t/a"})
    assert await asyncio.wait_for(woken, 5) is True
    assert await asyncio.wait_for(other, 5) is False
    assert notices.waiting == 0


async def test_a_store_between_the_look_and_the_wait_returns_at_once() -> None:
    notices = IngestNotices()
    before = notices.mark("t/a")
    assert before is None  # never stored here
    notices.stored({"t/a"})  # lands while the reader was looking at the store
    assert await asyncio.wait_for(notices.wait("t/a", 30, seen=before), 1) is True
    seen = notices.mark("t/a")
    notices.stored({"t/a"})
    assert await asyncio.wait_for(notices.wait("t/a", 30, seen=seen), 1) is True
    unchanged = notices.mark("t/a")
    assert await notices.wait("t/a", 0.01, seen=unchanged) is False


def test_marks_live_one_to_two_generations_of_recent_seconds() -> None:
    now = [0.0]
    notices = IngestNotices(clock=lambda: now[0], recent_seconds=30)
    notices.stored({"t/a"})
    now[0] = 31
    notices.stored({"t/b"})  # rotates: t/a is in the older generation
    assert notices.mark("t/a") is not None and notices.mark("t/b") is not None
    now[0] = 62
    notices.stored({"t/c"})  # rotates again: t/a is forgotten
    assert notices.mark("t/a") is None
    assert notices.mark("t/b") is not None and notices.mark("t/c") is not None
