"""Scenario 2: PostgreSQL stopped with ``pg_ctl stop -m immediate`` and restarted
on the same data directory, socket directory and port.

Two phases, each its own test:

* ``ingest``: while messages stream in (a fast LLM, so the outage mostly hits
  accounting: saving messages and reading tallies);
* ``compaction``: a batch of conversations is produced and fully stored, then
  the server is stopped while compactions are in flight (a slow LLM), so
  their transactions die or never start.

Each outage lasts a few seconds (no server at all: connections refused).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from core.adapters.postgres.migrate import migrate
from tests.chaos.harness import SCALE, ChaosStack, MakeStack, wait_until
from tests.chaos.workload import build_conversations, interleave
from tests.support.chaos_llm import ChaosLLMServer
from tests.support.pg_control import ControlledPostgres

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(SCALE.timeout)]

OUTAGE_SECONDS = 6.0


async def _outage(stack: ChaosStack, pg: ControlledPostgres) -> None:
    await asyncio.to_thread(pg.stop_immediate)
    stack.faults["pg_stop_immediate"] += 1
    await asyncio.sleep(OUTAGE_SECONDS)  # the outage itself
    await asyncio.to_thread(pg.start)
    await pg.wait_accepting()


async def _stored(stack: ChaosStack) -> int:
    """Messages accounted so far: live, or already compacted into a depth-0 batch."""
    try:
        live = await stack.db.fetchval("SELECT count(*) FROM messages WHERE kind = 'message'")
        archived = await stack.db.fetchval(
            "SELECT count(*) FROM archival_memory, unnest(source_message_ids) WHERE depth = 0"
        )
    except Exception:  # the pool reconnecting after the restart
        return -1
    return int(live) + int(archived)


@pytest.mark.parametrize("phase", ["ingest", "compaction"])
async def test_postgres_stopped_immediate_and_restarted(
    phase: str,
    make_stack: MakeStack,
    kafka_bootstrap: str,
    own_postgres: ControlledPostgres,
    chaos_llm: ChaosLLMServer,
) -> None:
    dsn = await own_postgres.create_database("chaos")
    await migrate(dsn)
    stack = await make_stack(
        f"postgres_restart_{phase}",
        kafka_bootstrap,
        dsn,
        extra_logs=[("postgres", own_postgres.log_path)],
    )
    outages = SCALE.pg_outages
    stack.notes["outage_seconds"] = OUTAGE_SECONDS
    stack.worker("w1")
    stack.worker("w2")
    await stack.wait_for_group()
    count = max(30, SCALE.conversations // 2)
    conversations = build_conversations(count, prefix=f"{stack.app_id}-c", seed=11)
    stack.add_conversations(conversations)
    window_start = time.monotonic()

    if phase == "ingest":
        chaos_llm.latency = (0.05, 0.2)
        stack.notes["llm_latency_ms"] = "50-200"
        events = interleave([c.events for c in conversations], seed=12)
        replay = asyncio.create_task(stack.replay(events, outages * 20.0 + 5.0))
        for k in range(outages):
            target = len(events) * (k + 1) // (outages + 1)

            async def progressed(n: int = target) -> bool:
                if replay.done():
                    replay.result()
                return len(stack.produced) >= n

            await wait_until(progressed, timeout=120, what=f"{target} events produced")
            await _outage(stack, own_postgres)
        await replay
    else:
        chaos_llm.latency = (0.8, 1.6)
        stack.notes["llm_latency_ms"] = "800-1600"
        batches = [conversations[k::outages] for k in range(outages)]
        for batch in batches:
            events = interleave([c.events for c in batch], seed=13)
            await stack.replay(events, 3.0)
            expected = len(stack.produced)

            async def all_stored(n: int = expected) -> bool:
                return await _stored(stack) >= n

            await wait_until(all_stored, timeout=120, what=f"{expected} messages stored")

            async def compacting() -> bool:
                return await stack.total_in_flight() > 0

            await wait_until(compacting, timeout=60, what="a compaction in flight", interval=0.1)
            stack.faults["pg_stop_mid_compaction"] += 1
            await _outage(stack, own_postgres)
    fault_end = time.monotonic()

    await stack.finish(
        fault_end,
        fault_window=fault_end - window_start,
        checks=[
            (
                stack.faults["pg_stop_immediate"] >= outages,
                f"{stack.faults['pg_stop_immediate']} outages, wanted {outages}",
            )
        ],
    )
