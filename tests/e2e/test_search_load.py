"""Searches over turns of ``max_content_chars`` do not stall the worker (issue 29).

Why: a search's snippets looked for every query word over the whole of every
returned turn, and its copies were found by lowering and splitting every
candidate's content, all on the event loop that also runs every consumer's
heartbeat and the probes: one snippet of a 1,000,000-character turn against a
200-word query took 206 ms, so a search at the limits blocked the loop for
seconds. Now that work is bounded per call and runs in the store's search
threads. Turns are archived straight into PostgreSQL (no compaction needed to
search them); ``/livez`` is polled from another process every 20 ms while four
searches at the limits run at once, and every answer must come within 250 ms.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.e2e.conftest import Stack, eventually
from tests.support.loop_probe import LivezProbe

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TURNS = 8
TURN_CHARS = 1_000_000  # [service].max_content_chars, the default
LIVEZ_LIMIT = float(os.environ.get("I29E_LIVEZ_LIMIT", "0.25"))
CONVERSATION = "conv-search-load"
# 200 words, 1,000 characters ([service].max_query_chars): one matches every turn
# (near its start), none of the others matches any.
QUERY = "alpha " + " ".join(f"q{i:03d}" for i in range(199))[:994]
SEARCHES = 4


async def archive_large_turns(stack: Stack) -> None:
    await stack.db.execute(
        """
        INSERT INTO archived_messages (conversation_id, id, compaction_id, role, content,
                                       created_at, token_estimate, seq)
        SELECT $1, 'm' || i, 'c-load', 'user',
               left('alpha ' || i || ' ' || repeat('Beta gamma delta epsilon. ', 40000), $2),
               now(), 250000, i
          FROM generate_series(1, $3) AS i
        """,
        CONVERSATION,
        TURN_CHARS,
        TURNS,
    )


async def test_searches_over_turns_of_max_content_chars_leave_livez_answering(
    stack: Stack,
) -> None:
    assert len(QUERY) <= 1000 and len(QUERY.split()) >= 199
    await archive_large_turns(stack)
    worker = stack.worker("w1")
    await worker.wait_ready(stack.names.messages)
    # Probed once its store is open: the searches' time, not the worker's start-up.
    await eventually(_store_open(worker), timeout=60, what="the worker's store open")
    probe = await LivezProbe(worker.url + "/livez").start()
    try:
        await eventually(_answered(probe), timeout=30, what="the probe's first answer")
        params = {"q": QUERY, "conversation_id": CONVERSATION, "limit": "50", "sources": "raw"}
        for _ in range(2):
            answers = await asyncio.gather(
                *(worker.get("/memory/search", params, timeout=60) for _ in range(SEARCHES))
            )
            for status, body in answers:
                assert status == 200, (status, body)
                assert len(body["turns"]) == TURNS, body["turns"][:1]
                assert all(len(t["text"]) <= 602 and t["truncated"] for t in body["turns"])
        polled = len(probe.polls)
        await eventually(lambda: _more_polls(probe, polled), timeout=10, what="a poll after")
    finally:
        await probe.stop()
    probe.check(LIVEZ_LIMIT)
    print(f"{len(probe.polls)} polls of /livez, the slowest {probe.slowest:.3f}s")


def _answered(probe: LivezProbe) -> Callable[[], Awaitable[None]]:
    async def check() -> None:
        assert probe.polls, "no answer yet"

    return check


def _store_open(worker: Any) -> Callable[[], Awaitable[None]]:
    async def check() -> None:
        status, body = await worker.get("/memory/search", {"q": "x", "conversation_id": "none"})
        assert status == 200, (status, body)

    return check


async def _more_polls(probe: LivezProbe, seen: int) -> None:
    assert len(probe.polls) > seen, "no poll since the searches"
