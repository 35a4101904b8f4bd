"""Scenario: a replicated cluster (three KRaft nodes, replication factor 3,
``min.insync.replicas`` 2) losing nodes while the service works on it.

* ``leader_kill9``: the node leading the busiest partitions SIGKILLed,
  repeatedly, restarted 5 s later (as a supervisor would), during a replay
  (the messages topic's leaders) and during compactions (the leaders of the
  commands, completions and clip-archive partitions that took the most
  records since the last kill). Each time the cluster is whole again (every
  partition fully in sync) before the next kill: two nodes down at once is
  not this scenario, and with ``min.insync.replicas`` 2 it refuses writes.
* ``rolling_restart``: each node in turn stopped with SIGTERM (a controlled
  shutdown: its leaderships move first) and started again, as an upgrade
  would, waiting for the cluster to be whole between nodes.
* ``node_down``: the node leading the most partitions SIGKILLed and left down
  for minutes while traffic flows; everything produced meanwhile must be
  stored before it comes back (two replicas in sync still take writes).

Every producer involved (the workers' Faust producer, the test's) sends with
acks=all and idempotence, so an acknowledged record is on two nodes at least
and no retry writes it twice. On top of the usual invariants,
``offsets_ahead`` is sampled every second: a committed offset never gets
ahead of PostgreSQL.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence

import pytest

from devtools.localstack import KafkaCluster
from tests.chaos.conftest import whole
from tests.chaos.harness import PARTITIONS, SCALE, ChaosStack, MakeStack, wait_until
from tests.chaos.kafka_tools import end_offsets, partition_leaders
from tests.chaos.workload import Conversation, build_conversations, interleave
from tests.support.chaos_llm import ChaosLLMServer

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(SCALE.timeout)]

REPLICAS = 3
KILLED_FOR_SECONDS = 5.0  # a killed node's supervisor restarts it after this
SECONDS_PER_KILL = 20.0  # replay time budgeted for one kill and the cluster healing


class Busiest:
    """Which node leads the partitions of ``topics`` that took the most records
    since the last look (the first look counts from the start)."""

    def __init__(self, bootstrap: str, topics: Sequence[str]) -> None:
        self.bootstrap = bootstrap
        self.topics = list(topics)
        self._last: dict[tuple[str, int], int] = {}

    async def mark(self) -> None:
        ends = await end_offsets(self.bootstrap, self.topics, PARTITIONS)
        self._last = {(tp.topic, tp.partition): offset for tp, offset in ends.items()}

    async def leader(self) -> tuple[int, int]:
        """(node id, records its partitions took since the last look)."""
        ends = await end_offsets(self.bootstrap, self.topics, PARTITIONS)
        leaders = await partition_leaders(self.bootstrap, self.topics)
        taken: Counter[int] = Counter()
        for tp, offset in ends.items():
            key = (tp.topic, tp.partition)
            if leaders.get(key, -1) >= 0:
                taken[leaders[key]] += offset - self._last.get(key, 0)
        self._last = {(tp.topic, tp.partition): offset for tp, offset in ends.items()}
        node, records = taken.most_common(1)[0]
        return node, records


async def _open(
    make_stack: MakeStack, scenario: str, cluster: KafkaCluster, dsn: str
) -> ChaosStack:
    stack = await make_stack(
        scenario,
        cluster.bootstrap_servers,
        dsn,
        replication=REPLICAS,
        extra_logs=[(f"kafka node {n.node_id}", n.log_path) for n in cluster.nodes],
    )
    stack.notes["replication"] = (
        f"{REPLICAS} replicas, min.insync.replicas 2, {len(cluster.nodes)} nodes"
    )
    stack.worker("w1")
    stack.worker("w2")
    await stack.wait_for_group()
    return stack


def _conversations(stack: ChaosStack, seed: int) -> list[Conversation]:
    conversations = build_conversations(
        max(30, SCALE.conversations // 2), prefix=f"{stack.app_id}-c", seed=seed
    )
    stack.add_conversations(conversations)
    return conversations


async def _healed(stack: ChaosStack, cluster: KafkaCluster) -> None:
    """Until the cluster is whole; how long that took goes in the result's notes."""
    took = await whole(cluster)
    stack.notes.setdefault("back_in_sync_seconds", []).append(round(took, 1))


async def _kill(stack: ChaosStack, cluster: KafkaCluster, node: int) -> None:
    """SIGKILL ``node``, restart it after ``KILLED_FOR_SECONDS``, wait until whole."""
    await asyncio.to_thread(cluster.kill, node)
    stack.faults["node_sigkill"] += 1
    await asyncio.sleep(KILLED_FOR_SECONDS)  # the outage itself
    started = time.monotonic()
    await asyncio.to_thread(cluster.restart, node)
    stack.notes.setdefault("restart_seconds", []).append(round(time.monotonic() - started, 1))
    await _healed(stack, cluster)


async def _progressed(stack: ChaosStack, replay: asyncio.Task[None], n: int) -> None:
    async def produced() -> bool:
        if replay.done():
            replay.result()
        return len(stack.produced) >= n

    await wait_until(produced, timeout=300, what=f"{n} events produced")


async def _stored(stack: ChaosStack) -> set[str]:
    rows = await stack.db.fetch(
        "SELECT id FROM messages WHERE kind = 'message' UNION SELECT id FROM archived_messages"
    )
    return {r["id"] for r in rows}


@pytest.mark.parametrize("phase", ["replay", "compaction"])
async def test_the_leader_of_the_busiest_partitions_killed_repeatedly(
    phase: str,
    make_stack: MakeStack,
    cluster: KafkaCluster,
    pg_database: str,
    chaos_llm: ChaosLLMServer,
) -> None:
    stack = await _open(make_stack, f"cluster_leader_kill9_{phase}", cluster, pg_database)
    conversations = _conversations(stack, seed=41 if phase == "replay" else 43)
    kills = SCALE.leader_kills
    window_start = time.monotonic()
    if phase == "replay":
        chaos_llm.latency = (0.05, 0.2)
        stack.notes["llm_latency_ms"] = "50-200"
        busiest = Busiest(stack.bootstrap, [stack.names.messages])
        events = interleave([c.events for c in conversations], seed=42)
        replay = asyncio.create_task(stack.replay(events, kills * SECONDS_PER_KILL + 5.0))
        for k in range(kills):
            await _progressed(stack, replay, len(events) * (k + 1) // (kills + 1))
            node, _ = await busiest.leader()
            await _kill(stack, cluster, node)
        await replay
    else:
        chaos_llm.latency = (0.8, 1.6)
        stack.notes["llm_latency_ms"] = "800-1600"
        names = stack.names
        busiest = Busiest(stack.bootstrap, [names.commands, names.control, names.clip_archives])
        for k in range(kills):
            await busiest.mark()
            batch = conversations[k::kills]
            await stack.replay(interleave([c.events for c in batch], seed=44 + k), 3.0)

            async def compacting() -> bool:
                return await stack.total_in_flight() > 0

            await wait_until(compacting, timeout=90, what="a compaction in flight", interval=0.1)
            node, records = await busiest.leader()
            stack.faults["node_sigkill_mid_compaction"] += 1
            stack.notes.setdefault("records_led_by_victim", []).append(records)
            await _kill(stack, cluster, node)
    fault_end = time.monotonic()
    await stack.finish(
        fault_end,
        fault_window=fault_end - window_start,
        checks=[
            (stack.faults["node_sigkill"] >= kills, f"{stack.faults['node_sigkill']} kills"),
        ],
    )


async def test_a_rolling_restart_of_every_node(
    make_stack: MakeStack, cluster: KafkaCluster, pg_database: str, chaos_llm: ChaosLLMServer
) -> None:
    stack = await _open(make_stack, "cluster_rolling_restart", cluster, pg_database)
    chaos_llm.latency = (0.2, 0.5)
    stack.notes["llm_latency_ms"] = "200-500"
    conversations = _conversations(stack, seed=51)
    events = interleave([c.events for c in conversations], seed=52)
    restarts = SCALE.rolling_rounds * len(cluster.nodes)
    window_start = time.monotonic()
    replay = asyncio.create_task(stack.replay(events, restarts * 12.0 + 5.0))
    for k in range(restarts):
        node = cluster.nodes[k % len(cluster.nodes)]
        await _progressed(stack, replay, len(events) * (k + 1) // (restarts + 1))
        started = time.monotonic()
        await asyncio.to_thread(cluster.stop, node.node_id)  # SIGTERM: controlled shutdown
        stack.notes.setdefault("controlled_shutdown_seconds", []).append(
            round(time.monotonic() - started, 1)
        )
        stack.faults["controlled_restart"] += 1
        started = time.monotonic()
        await asyncio.to_thread(cluster.restart, node.node_id)
        stack.notes.setdefault("restart_seconds", []).append(round(time.monotonic() - started, 1))
        await _healed(stack, cluster)
    await replay
    fault_end = time.monotonic()
    await stack.finish(
        fault_end,
        fault_window=fault_end - window_start,
        checks=[
            (
                stack.faults["controlled_restart"] >= restarts,
                f"{stack.faults['controlled_restart']} restarts, wanted {restarts}",
            )
        ],
    )


async def test_a_node_down_for_minutes_while_traffic_flows(
    make_stack: MakeStack, cluster: KafkaCluster, pg_database: str, chaos_llm: ChaosLLMServer
) -> None:
    stack = await _open(make_stack, "cluster_node_down", cluster, pg_database)
    chaos_llm.latency = (0.2, 0.5)
    stack.notes["llm_latency_ms"] = "200-500"
    down_for = SCALE.node_down_seconds
    stack.notes["down_seconds"] = down_for
    conversations = _conversations(stack, seed=61)
    events = interleave([c.events for c in conversations], seed=62)
    busiest = Busiest(stack.bootstrap, [stack.names.messages])
    window_start = time.monotonic()
    replay = asyncio.create_task(stack.replay(events, down_for * 1.2 + 10.0))
    await _progressed(stack, replay, len(events) // 10)
    node, _ = await busiest.leader()
    await asyncio.to_thread(cluster.kill, node)
    stack.faults["node_sigkill"] += 1
    down_since = time.monotonic()
    await asyncio.sleep(down_for * 0.75)  # the outage itself, traffic flowing
    produced = dict(stack.produced)

    async def all_stored() -> bool:
        return set(produced) <= await _stored(stack)

    waited = await wait_until(all_stored, timeout=down_for * 0.25 + 60, what="stored while down")
    stack.notes["stored_with_a_node_down"] = len(produced)
    stack.notes["caught_up_while_down_seconds"] = round(waited, 1)
    remaining = down_since + down_for - time.monotonic()
    if remaining > 0:
        await asyncio.sleep(remaining)  # the rest of the outage
    started = time.monotonic()
    await asyncio.to_thread(cluster.restart, node)
    stack.notes.setdefault("restart_seconds", []).append(round(time.monotonic() - started, 1))
    await _healed(stack, cluster)
    await replay
    fault_end = time.monotonic()
    await stack.finish(
        fault_end,
        fault_window=fault_end - window_start,
        checks=[(time.monotonic() - down_since >= down_for, "the node was down long enough")],
    )
