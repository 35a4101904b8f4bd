"""SIGKILL the worker inside a stretched table-flush interval, with final counts unflushed.

After a large flush the next one waits so that the changelog takes at most
``[service].table_writes_per_second`` writes a second on average, up to 10 s
(``streams.worker.tally_table``). A message accounted in that wait has changed
a table entry only the next flush writes, so its offset must not be committed
before that flush (``AcksAfterFlush``): killed then, the worker restores its
table from a changelog without that count, and only reading the record again
brings it back. A conversation that receives another message later is
resynced from PostgreSQL anyway, so each kill here lands after the **last**
message of a few conversations was stored, while the flush after it is still
due, and longer than the worker's commit interval (1 s) after: a worker that
acked before flushing would have committed past those messages by then. The
write rate is 2 a second and background conversations keep the flushes large,
so the interval stays stretched. The invariants then compare every table entry
with PostgreSQL (``table_drift``) and nothing may be lost or left uncommitted.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.chaos.harness import SCALE, ChaosStack, ChaosWorker, MakeStack
from tests.chaos.workload import Conversation, build_conversations, interleave
from tests.support.chaos_llm import ChaosLLMServer
from tests.support.metrics_text import metric

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(SCALE.timeout)]

WRITES_PER_SECOND = 2.0
LONG_WAIT = 6.0  # seconds a flush interval must be to hold a kill round
PAST_COMMITS = 2.5  # seconds after the last messages were stored: > 2 commit intervals
FINAL_GROUP = 8  # conversations whose last message each round sends


async def _table_figures(worker: ChaosWorker) -> tuple[float, float] | None:
    """(flush interval now, table writes so far); None when it does not answer."""
    try:
        text = await worker.metrics_text()
    except Exception:
        return None
    return (
        metric(text, "compactor_table_flush_interval_seconds"),
        metric(text, "compactor_table_writes_total"),
    )


async def _just_flushed_with_a_long_wait(worker: ChaosWorker, deadline: float) -> float:
    """The table writes count right after a flush that set a long interval."""
    last: float | None = None
    while time.monotonic() < deadline:
        figures = await _table_figures(worker)
        if figures is not None:
            interval, writes = figures
            if last is not None and writes != last and interval >= LONG_WAIT:
                return writes
            last = writes
        await asyncio.sleep(0.05)
    raise AssertionError(f"no flush with a wait of {LONG_WAIT}s or more")


async def _final_counts_unflushed(
    stack: ChaosStack, worker: ChaosWorker, tails: list[dict[str, Any]], writes: float
) -> bool:
    """Send ``tails``; True once they are stored, ``PAST_COMMITS`` have passed and the
    worker has still not flushed; False as soon as it flushes (the round is lost)."""
    ids = [str(t["message_id"]) for t in tails]
    await stack.send_messages(tails)
    stored_at: float | None = None
    while True:
        figures = await _table_figures(worker)
        if figures is None or figures[1] != writes:
            return False
        if stored_at is None:
            found = await stack.db.fetchval(
                "SELECT count(*) FROM messages WHERE id = ANY($1::text[])", ids
            )
            if found == len(ids):
                stored_at = time.monotonic()
        elif time.monotonic() - stored_at >= PAST_COMMITS:
            return True
        await asyncio.sleep(0.05)


def _final_groups(prefix: str, groups: int) -> list[Conversation]:
    """Short conversations (4 turns, well under the budget: never compacted, so
    nothing but their own messages ever touches their table entries)."""
    return build_conversations(groups * FINAL_GROUP, prefix=prefix, seed=13, turns=(4, 4))


async def test_a_kill_inside_a_stretched_flush_interval_loses_no_count(
    make_stack: MakeStack, kafka_bootstrap: str, pg_database: str, chaos_llm: ChaosLLMServer
) -> None:
    chaos_llm.latency = (0.05, 0.2)
    stack = await make_stack("stretched_flush_kill9", kafka_bootstrap, pg_database)
    stack.configure({"service": {"table_writes_per_second": WRITES_PER_SECOND}})
    stack.notes["table_writes_per_second"] = WRITES_PER_SECOND
    worker = stack.worker("w1")
    await stack.wait_for_group()

    background = build_conversations(SCALE.conversations, prefix=f"{stack.app_id}-c", seed=11)
    finals = _final_groups(f"{stack.app_id}-f", 3 * SCALE.kills)
    stack.add_conversations([*background, *finals])
    await stack.send_messages(interleave([c.events[:-1] for c in finals], seed=14))
    events = interleave([c.events for c in background], seed=12)
    replay = asyncio.create_task(stack.replay(events, 30.0 * SCALE.kills))
    window_start, rounds = time.monotonic(), 0
    for start in range(0, len(finals), FINAL_GROUP):
        if stack.faults["sigkill"] >= SCALE.kills or replay.done():
            break
        rounds += 1
        writes = await _just_flushed_with_a_long_wait(worker, time.monotonic() + 60.0)
        tails = [c.events[-1] for c in finals[start : start + FINAL_GROUP]]
        if await _final_counts_unflushed(stack, worker, tails, writes):
            worker.sigkill()
            stack.faults["sigkill"] += 1
            await stack.wait_for_group()  # restarted by the supervisor
    await replay
    fault_end = time.monotonic()

    kills = stack.faults["sigkill"]
    stack.notes["rounds"] = rounds
    await stack.finish(
        fault_end,
        fault_window=fault_end - window_start,
        checks=[(kills >= SCALE.kills, f"{kills} kills in {rounds} rounds, wanted {SCALE.kills}")],
    )
