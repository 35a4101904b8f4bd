"""Scenario 3: the broker SIGKILLed and restarted on the same data directory and ports.

The test owns this broker (the session's serves other tests). While it is
down, workers lose their group, producers their leader, and the outbox relay
its target; afterwards everything must resume from committed offsets and the
outbox with nothing lost or doubled. The test's producer retries until the
restarted broker acknowledges, so "produced" always means acknowledged.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from devtools.localstack import KafkaBroker
from tests.chaos.harness import SCALE, MakeStack, wait_until
from tests.chaos.workload import build_conversations, interleave
from tests.support.chaos_llm import ChaosLLMServer

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(SCALE.timeout)]

OUTAGE_SECONDS = 5.0


def _sigkill(broker: KafkaBroker) -> None:
    """SIGKILL the broker's process group (it leads its own)."""
    pid = broker.pid
    assert pid is not None and broker.is_running()
    os.killpg(pid, signal.SIGKILL)


async def test_broker_sigkilled_and_restarted(
    own_broker: KafkaBroker,  # before make_stack: torn down after the workers stop
    make_stack: MakeStack,
    pg_database: str,
    chaos_llm: ChaosLLMServer,
) -> None:
    chaos_llm.latency = (0.2, 0.5)
    stack = await make_stack(
        "broker_kill9",
        own_broker.bootstrap_servers,
        pg_database,
        extra_logs=[("broker", own_broker.log_path)],
    )
    stack.notes["llm_latency_ms"] = "200-500"
    stack.notes["outage_seconds"] = OUTAGE_SECONDS
    stack.worker("w1")
    stack.worker("w2")
    await stack.wait_for_group()
    conversations = build_conversations(
        max(40, SCALE.conversations // 2), prefix=f"{stack.app_id}-c", seed=21
    )
    stack.add_conversations(conversations)
    events = interleave([c.events for c in conversations], seed=22)
    outages = SCALE.broker_outages
    window_start = time.monotonic()
    replay = asyncio.create_task(stack.replay(events, outages * 25.0 + 5.0))
    for k in range(outages):
        target = len(events) * (k + 1) // (outages + 1)

        async def progressed(n: int = target) -> bool:
            if replay.done():
                replay.result()
            return len(stack.produced) >= n

        await wait_until(progressed, timeout=180, what=f"{target} events produced")
        _sigkill(own_broker)

        async def dead() -> bool:
            return not own_broker.is_running()  # polls, so reaps, the process

        await wait_until(dead, timeout=30, what="broker dead")
        stack.faults["broker_sigkill"] += 1
        await asyncio.sleep(OUTAGE_SECONDS)  # the outage itself
        own_broker.start()
        await asyncio.to_thread(own_broker.wait_ready, 120.0)
    await replay
    fault_end = time.monotonic()

    await stack.finish(
        fault_end,
        fault_window=fault_end - window_start,
        checks=[
            (
                stack.faults["broker_sigkill"] >= outages,
                f"{stack.faults['broker_sigkill']} broker kills, wanted {outages}",
            )
        ],
    )
