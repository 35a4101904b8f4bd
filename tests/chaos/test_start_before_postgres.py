"""A worker started while PostgreSQL is down keeps every record it reads meanwhile.

Why: the agents wait for the runtime (PostgreSQL, the summariser) before they
handle an event, and a worker that starts during a database outage reads its
partitions all the same. A suspected way for the first records of fresh
partitions to be lost (chaos runs lost offsets 0 and 1 so, docs/reliability.md)
was that those records, delivered before an agent first iterates its stream,
found no channel in Faust's conductor and were dropped. This is that case made
long: PostgreSQL is stopped before the workers start; one starts, a second
joins (a rebalance before either runtime could open, as in the losing runs);
messages are produced and read (both consumers' lag reaches 0) while it is
down; then it starts, and every message must be stored and no committed
offset may pass a message that is not. It passes with the code as it is, so
that suspicion was wrong; the test stays for the promise it checks.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from core.adapters.postgres.migrate import migrate
from tests.chaos.harness import MakeStack, wait_until
from tests.chaos.workload import build_conversations, interleave
from tests.support.chaos_llm import ChaosLLMServer
from tests.support.pg_control import ControlledPostgres
from tests.support.worker import WorkerProcess

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(600)]

LAG = re.compile(r'^compactor_consumer_lag\{[^}]*topic="([^"]+)"[^}]*\} (\S+)$', re.M)


async def read_everything(worker: WorkerProcess, topic: str) -> bool:
    """The worker's consumer has read every record of ``topic`` (its lag is 0)."""
    try:
        text = await worker.metrics_text()
    except Exception:  # not answering yet
        return False
    lags = [float(value) for name, value in LAG.findall(text) if name == topic]
    return bool(lags) and not any(lags)


async def test_records_read_while_postgres_is_down_at_start_are_all_stored(
    make_stack: MakeStack,
    kafka_bootstrap: str,
    own_postgres: ControlledPostgres,
    chaos_llm: ChaosLLMServer,
) -> None:
    dsn = await own_postgres.create_database("chaos")
    await migrate(dsn)
    stack = await make_stack(
        "start_before_postgres",
        kafka_bootstrap,
        dsn,
        extra_logs=[("postgres", own_postgres.log_path)],
    )
    chaos_llm.latency = (0.05, 0.2)
    await asyncio.to_thread(own_postgres.stop_immediate)
    stack.faults["pg_down_at_start"] += 1
    first = stack.worker("w1")
    await stack.wait_for_group()
    second = stack.worker("w2")  # a rebalance before either runtime could open
    await stack.wait_for_group()
    conversations = build_conversations(20, prefix=f"{stack.app_id}-c", seed=61)
    stack.add_conversations(conversations)
    window_start = time.monotonic()
    await stack.replay(interleave([c.events for c in conversations], seed=62), 3.0)

    async def read_all() -> bool:
        return all([await read_everything(w, stack.names.messages) for w in (first, second)])

    await wait_until(read_all, timeout=120, what="every message read while PostgreSQL is down")
    stack.notes["messages_read_before_postgres"] = len(stack.produced)
    await asyncio.to_thread(own_postgres.start)
    await own_postgres.wait_accepting()
    fault_end = time.monotonic()
    await stack.finish(fault_end, fault_window=fault_end - window_start)
