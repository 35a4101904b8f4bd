"""A long run: steady traffic for a long time, a fault every few minutes, and a
verdict on whether anything grows without bound.

What runs: two real workers (``tests.chaos.harness.ChaosStack``, supervised
and restarted after a kill as systemd would), a Kafka broker and a
PostgreSQL server of the run's own (so the run may kill them), and the local
LLM wire-protocol server answering in ~``--llm-ms`` with jitter
(``tests.support.chaos_llm``). Traffic is ``--rate`` message events a second
spread at random over ``--conversations`` conversations that never end (user
and assistant turns, tool call/result pairs), so every conversation crosses
its token budget again and again and compactions never stop.

Every ``--fault-every`` seconds one fault, in rotation: SIGKILL of a worker
(the two alternately, mid-compaction when one is in flight), PostgreSQL
stopped ``-m immediate`` and restarted, the broker SIGKILLed and restarted,
an LLM storm (every request fails in one of eight ways for ``--storm-seconds``).

Every ``--sample-every`` seconds: each worker's RSS and open file descriptors
(``/proc/<pid>``), the consumer lag of the messages topic (end offsets minus
the group's committed offsets), conversations over budget, and every table's
``pg_total_relation_size`` / heap / index size and live rows.

The verdict (the exit status) fails on growth without bound, judged over the
second half of the run, when warm-up is over:

* ``rss`` / ``fds``: per worker, a least-squares line through the samples of
  its longest-lived process in the second half (a process's first 60 s left
  out: a restarted worker rebuilds its tables); the growth that line gives
  over the second half must stay under ``--max-rss-growth-mib`` (32 MiB: about
  1 MiB a minute in an hour's run) and, for descriptors, through the lowest
  count of each eighth of the samples (connections come and go; a leak raises
  the floor), under ``--max-fd-growth`` (8);
* ``lag``: after each fault the lag must come back near zero (at most
  ``--near-zero-lag-seconds`` of traffic, 5 s), and stay there 10 s, within 3
  minutes, polled every second; the next fault waits for that, so each recovery is measured alone (the
  traffic goes on for half an interval after the last recovery); and the
  line through the lag between faults (fault to recovery left out) must not
  grow by more than that over the second half;
* ``storage``: tables grow with the data, so they are judged per message
  produced: the database's bytes per message at the end at most 1.25 x those
  at mid-run (bloat: dead rows or indexes growing faster than the data);
  ``messages`` holds only live context, bounded by conversations x budget,
  so its size at the end at most 1.5 x (+ 4 MiB) its size at mid-run; and no
  table over 1 MiB whose index-to-heap ratio grew by more than 1.5 x;
* ``invariants``: after the traffic stops, every invariant of the
  fault-injection suite (``tests/chaos/invariants.py``: 0 lost, 0
  duplicated, no split tool pair, every conversation under budget, tallies
  equal PostgreSQL, no committed offset ahead of PostgreSQL) holds within
  two minutes, and no worker exited without being killed.

    python -m bench.soak --minutes 60 --rate 500 --conversations 5000 \\
        --fault-every 180 --out soak-out

prints a table, writes ``soak.json`` and (with matplotlib, the ``bench``
extra) ``soak.png`` under ``--out`` (and, every minute while it runs,
``soak-partial.json``: the samples so far, what an interrupted run leaves). ``tests/chaos/test_soak.py`` runs the
same code for under two minutes in CI and asserts the verdict.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from bench.harness import WORDS, note, print_header, proc_status, start_local_broker, table
from devtools.localstack import KafkaBroker
from tests.chaos.harness import (
    BUDGET_TOKENS,
    PARTITIONS,
    ChaosStack,
    ChaosWorker,
    short_summary,
    wait_until,
)
from tests.chaos.workload import T0
from tests.support.chaos_llm import ChaosLLMServer, storm_actions
from tests.support.pg_control import ControlledPostgres, own_server

FAULTS = ("worker_kill9", "postgres_restart", "broker_restart", "llm_storm")
LLM_TIMEOUT_SECONDS = 5.0  # ChaosStack.config()'s [summarization].timeout_seconds
WARMUP_SECONDS = 60.0
STEADY_SECONDS = 10.0  # lag near zero this long after a fault counts as recovered  # of each worker process, left out of its RSS and fd lines
MiB = 1024 * 1024
_TOOLS = ("search_logs", "get_metrics", "run_query", "open_ticket")


@dataclass(frozen=True)
class Plan:
    minutes: float = 60.0
    rate: float = 500.0  # message events a second
    conversations: int = 5000
    fault_every: float = 180.0  # seconds
    llm_ms: float = 300.0
    sample_every: float = 10.0
    outage_seconds: float = 6.0  # PostgreSQL and broker down this long
    storm_seconds: float = 20.0
    workers: int = 2
    seed: int = 0
    # Compactions in flight per worker: the chaos stack's 8 unless given. With a
    # 300 ms provider, 2 workers x 8 slots compact ~26 conversations a second.
    compaction_slots: int | None = None
    recovery_limit: float = 180.0  # seconds for the lag to come back after a fault

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0


@dataclass(frozen=True)
class Limits:
    max_rss_growth_mib: float = 32.0
    max_fd_growth: float = 8.0
    near_zero_lag_seconds: float = 5.0  # of traffic
    bytes_per_message_growth: float = 1.25
    messages_table_growth: float = 1.5
    index_ratio_growth: float = 1.5
    # Tables reach their steady state only after autovacuum's first passes (a
    # 3-minute run ends with 100 dead rows in messages for each live one): storage
    # is judged only in runs at least this long, and reported in every run.
    storage_after_minutes: float = 20.0

    def near_zero_lag(self, rate: float) -> float:
        return max(50.0, rate * self.near_zero_lag_seconds)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Fault:
    kind: str
    start: float  # seconds since traffic started
    end: float
    detail: str = ""
    peak_lag: int | None = None
    lag_back_after: float | None = None  # seconds from the fault's end to lag near zero
    peak_over_budget: int | None = None


# --------------------------------------------------------------------------- traffic


class Traffic:
    """Conversations that never end, picked at random per event. Only what the
    invariants need of each event (ids, roles, tool links) is kept, not its text,
    so an hour's traffic fits in memory."""

    def __init__(self, conversations: int, prefix: str, seed: int, chars: int = 300) -> None:
        self.rng = random.Random(seed)
        self.chars = chars
        self.ids = [f"{prefix}{i:05d}" for i in range(conversations)]
        self.count = [0] * conversations
        self.last_role = ["assistant"] * conversations
        self.pending_call: list[str | None] = [None] * conversations

    def _text(self, head: str, chars: int) -> str:
        words = [head]
        length = len(head)
        while length < chars:
            word = self.rng.choice(WORDS)
            words.append(word)
            length += len(word) + 1
        return " ".join(words)[:chars]

    def next_event(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the event to produce, what the invariants keep of it)."""
        i = self.rng.randrange(len(self.ids))
        cid, n = self.ids[i], self.count[i]
        self.count[i] += 1
        event: dict[str, Any] = {
            "schema_version": 1,
            "message_id": f"{cid}-m{n:05d}",
            "conversation_id": cid,
            "created_at": (T0 + timedelta(seconds=20 * n)).isoformat(),
        }
        head = f"{cid} turn {n}:"
        kept: dict[str, Any] = {"message_id": event["message_id"]}
        call = self.pending_call[i]
        if call is not None:
            event.update(role="tool", content=self._text(head, self.chars), tool_call_id=call)
            kept["tool_call_id"] = call
            self.pending_call[i] = None
        elif self.last_role[i] in ("assistant", "tool"):
            event.update(role="user", content=self._text(head, self.chars))
        elif self.rng.random() < 0.3:
            call_id = f"call-{cid}-{n}"
            event.update(
                role="assistant",
                content=self._text(head, self.chars // 3),
                tool_calls=[
                    {
                        "id": call_id,
                        "name": self.rng.choice(_TOOLS),
                        "arguments": {"q": self.rng.choice(WORDS)},
                    }
                ],
            )
            kept["tool_calls"] = [{"id": call_id}]
            self.pending_call[i] = call_id
        else:
            event.update(role="assistant", content=self._text(head, self.chars))
        self.last_role[i] = event["role"]
        kept["role"] = event["role"]
        return event, kept


class SoakStack(ChaosStack):
    """A chaos stack whose offset watch samples every 5 s, not every second: it
    scans every produced message each time, and an hour's run produces millions."""

    async def _watch_offsets(self) -> None:
        while True:
            if self.pool is not None:
                await self.offsets.sample(self.pool, self.produced)
            await asyncio.sleep(5.0)


# --------------------------------------------------------------------------- sampling

_TABLES_SQL = """
SELECT c.relname AS name,
       pg_total_relation_size(c.oid) AS total,
       pg_relation_size(c.oid) AS heap,
       pg_indexes_size(c.oid) AS index,
       coalesce(s.n_live_tup, 0) AS live_rows,
       coalesce(s.n_dead_tup, 0) AS dead_rows
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relkind = 'r' AND n.nspname = 'public'
"""

_OVER_BUDGET_SQL = """
SELECT count(*) FROM (
    SELECT conversation_id FROM messages
    GROUP BY conversation_id HAVING sum(token_estimate) > $1
) AS over
"""


def worker_sample(worker: ChaosWorker) -> dict[str, Any]:
    """RSS and open descriptors of the worker's process now; empty while it is down."""
    if not worker.alive:
        return {}
    try:
        pid = worker.pid
        rss_kib = proc_status(pid)["VmRSS"]
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, KeyError, AssertionError):
        return {}
    return {"pid": pid, "rss_mib": round(rss_kib / 1024, 1), "fds": fds}


class LagProbe:
    """Consumer lag of the worker group on the messages topic (end offsets minus
    committed offsets, summed), through clients kept for the whole run and made
    anew after a failure (the broker restarts under them)."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()

    async def lag(self) -> int | None:
        """The lag now, or None when the broker does not answer within 10 s."""
        async with self._lock:
            try:
                return await asyncio.wait_for(self._read(), 10)
            except Exception:
                await self.close()
                return None

    async def _read(self) -> int:
        if self._admin is None or self._consumer is None:
            self._admin = AIOKafkaAdminClient(
                bootstrap_servers=self.bootstrap, request_timeout_ms=5000
            )
            self._consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap, group_id=None, request_timeout_ms=5000
            )
            await self._admin.start()
            await self._consumer.start()
        committed = await self._admin.list_consumer_group_offsets(
            self.group, partitions=self.partitions
        )
        ends = await self._consumer.end_offsets(self.partitions)
        total = 0
        for tp in self.partitions:
            meta = committed.get(tp)
            total += int(ends[tp]) - (max(meta.offset, 0) if meta is not None else 0)
        return total

    async def close(self) -> None:
        admin, consumer = self._admin, self._consumer
        self._admin = self._consumer = None
        if consumer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), 5)
        if admin is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(admin.close(), 5)


async def _database(stack: ChaosStack, budget: int) -> tuple[dict[str, Any], int]:
    rows = await stack.db.fetch(_TABLES_SQL)
    over = int(await stack.db.fetchval(_OVER_BUDGET_SQL, budget))
    tables = {
        r["name"]: {k: int(r[k]) for k in ("total", "heap", "index", "live_rows", "dead_rows")}
        for r in rows
    }
    return tables, over


async def _within(seconds: float, what: Any) -> Any:
    """``what`` or None when it fails or takes too long (its service is down)."""
    try:
        return await asyncio.wait_for(what, seconds)
    except Exception:
        return None


# --------------------------------------------------------------------------- the run


class Soak:
    def __init__(
        self,
        plan: Plan,
        *,
        broker: KafkaBroker,
        pg: ControlledPostgres,
        dsn: str,
        llm: ChaosLLMServer,
        root: Path,
        limits: Limits | None = None,
        partial: Path | None = None,
    ) -> None:
        self.plan = plan
        self.partial = partial  # the samples so far, rewritten every minute
        self.limits = limits or Limits()
        self.broker = broker
        self.pg = pg
        self.llm = llm
        self.stack = SoakStack(
            scenario="soak", bootstrap=broker.bootstrap_servers, dsn=dsn, llm=llm, root=root
        )
        if plan.compaction_slots is not None:
            slots = {"max_concurrent_compactions": plan.compaction_slots}
            self.stack.configure({"service": slots})
        self.traffic = Traffic(plan.conversations, f"{self.stack.app_id}-c", plan.seed)
        self.samples: list[dict[str, Any]] = []
        self.faults: list[Fault] = []
        self.t0 = time.monotonic()
        self.traffic_seconds = 0.0
        self.invariants: dict[str, Any] = {}
        self.kills = 0
        self.stop_traffic = asyncio.Event()
        self.lag_probe = LagProbe(
            broker.bootstrap_servers, self.stack.app_id, self.stack.names.messages
        )

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    async def run(self) -> None:
        plan = self.plan
        spread = plan.llm_ms / 1000 * 0.2
        self.llm.latency = (plan.llm_ms / 1000 - spread, plan.llm_ms / 1000 + spread)
        stack = self.stack
        await stack.open()
        try:
            for i in range(plan.workers):
                stack.worker(f"w{i + 1}")
            await stack.wait_for_group()
            note(f"{plan.workers} workers own the partitions; traffic starts")
            self.t0 = time.monotonic()
            sampler = asyncio.create_task(self._sample_forever())
            producing = asyncio.create_task(self._produce())
            try:
                await self._faults(producing)
                # Traffic goes on at least as planned, and a quiet stretch after the
                # last fault's recovery, so the second half has samples between faults.
                last = self.faults[-1].end + (self.faults[-1].lag_back_after or 0.0)
                ends = max(plan.seconds, last + plan.fault_every / 2)
                await asyncio.sleep(max(0.0, self.t0 + ends - time.monotonic()))  # schedule
                self.stop_traffic.set()
                await producing
                self.traffic_seconds = self.now()
                note(f"traffic over after {self.traffic_seconds:.0f}s; settling")
                outcome = await stack.settle(time.monotonic())
                await self._sample()
            finally:
                self.stop_traffic.set()
                for task in (sampler, producing):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await self.lag_probe.close()
            self.invariants = {
                "ok": outcome.report.ok and not outcome.history,
                "recovered_after_seconds": None
                if outcome.recovered_after is None
                else round(outcome.recovered_after, 1),
                "violations": outcome.report.counts(),
                "describe": "" if outcome.report.ok else outcome.report.describe(),
                "unexpected_exits": outcome.history,
                "messages_produced": len(stack.produced),
                "producer_retries": stack.producer.retries,
                "worker_restarts": sum(w.restarts for w in stack.workers),
                "offset_samples": stack.offsets.samples,
            }
        finally:
            await stack.close()

    async def _produce(self) -> None:
        """``rate`` events a second, in ticks of 0.1 s, until ``stop_traffic``; after
        an outage the backlog goes out at once (as a producer's buffer would)."""
        sent = 0
        while not self.stop_traffic.is_set():
            due = int((time.monotonic() - self.t0) * self.plan.rate) + 1
            if due <= sent:
                await asyncio.sleep(0.1)  # pacing the traffic, not waiting for a state
                continue
            batch = [self.traffic.next_event() for _ in range(min(due - sent, 5000))]
            await self.stack.send_messages([event for event, _ in batch])
            for event, kept in batch:
                self.stack.conversations.setdefault(event["conversation_id"], []).append(kept)
            sent += len(batch)

    async def _sample_forever(self) -> None:
        while True:
            started = time.monotonic()
            await self._sample()
            self.llm.requests.clear()  # the test server records every request
            if len(self.samples) % max(1, round(60 / self.plan.sample_every)) == 1:
                self._progress(self.samples[-1])
                self._write_partial()
            await asyncio.sleep(max(0.0, self.plan.sample_every - (time.monotonic() - started)))

    def _write_partial(self) -> None:
        """What an interrupted run leaves: the plan, faults and samples so far."""
        if self.partial is None:
            return
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        partial = {
            "plan": asdict(self.plan),
            "faults": [asdict(f) for f in self.faults],
            "samples": self.samples,
        }
        self.partial.write_text(json.dumps(partial))

    @staticmethod
    def _progress(sample: Mapping[str, Any]) -> None:
        """A line a minute on stderr, to watch a long run."""
        workers = ", ".join(
            f"{name} {w['rss_mib']:.0f} MiB {w['fds']} fds" if w else f"{name} down"
            for name, w in sample["workers"].items()
        )
        note(
            f"t={sample['t'] / 60:.1f} min: {sample['produced']} produced, lag {sample['lag']}, "
            f"{sample['over_budget']} over budget; {workers}; load {sample['load_1min']}"
        )

    async def _sample(self) -> None:
        stack = self.stack
        lag = await self.lag_probe.lag()
        database = await _within(15, _database(stack, BUDGET_TOKENS))
        tables, over = database if database is not None else (None, None)
        self.samples.append(
            {
                "t": self.now(),
                "produced": len(stack.produced),
                "workers": {w.name: worker_sample(w) for w in stack.workers},
                "lag": lag,
                "over_budget": over,
                "tables": tables,
                "driver_rss_mib": round(proc_status(os.getpid())["VmRSS"] / 1024, 1),
                "llm_served": sum(self.llm.served.values()),
                # The machine may be shared: a starved worker falls behind for no fault of its own.
                "load_1min": round(os.getloadavg()[0], 2),
            }
        )

    def planned_faults(self) -> int:
        """As many as fit with half an interval after the last to recover in."""
        plan = self.plan
        return max(1, int((plan.seconds - plan.fault_every / 2) // plan.fault_every))

    async def _faults(self, producing: asyncio.Task[None]) -> None:
        """The faults in rotation, one every ``fault_every`` seconds, each after the
        lag is back near zero from the one before (so each recovery is measured
        alone); a recovery longer than ``recovery_limit`` is recorded as none."""
        for k in range(self.planned_faults()):
            delay = self.t0 + (k + 1) * self.plan.fault_every - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # the fault schedule, not a wait for a state
            if producing.done():
                producing.result()
            kind = FAULTS[k % len(FAULTS)]
            start = self.now()
            note(f"fault {k + 1}: {kind}")
            detail = await getattr(self, f"_{kind}")()
            fault = Fault(kind, start, self.now(), detail)
            self.faults.append(fault)
            self.stack.faults[kind] += 1
            fault.lag_back_after = await self._lag_back(fault)
            note(f"fault {k + 1}: lag back near zero after {fault.lag_back_after}s")

    async def _lag_back(self, fault: Fault) -> float | None:
        """Seconds from the fault's end until the lag is near zero and stays there
        for ``STEADY_SECONDS`` (polled every second: a killed worker's partitions
        stall only once its session expires, so a first low reading may come
        before the rise); None if that does not happen within ``recovery_limit``."""
        near = self.limits.near_zero_lag(self.plan.rate)
        ended = self.t0 + fault.end
        since: float | None = None

        async def steady_near_zero() -> bool:
            nonlocal since
            lag = await self.lag_probe.lag()
            if lag is None or lag > near:
                since = None
                return False
            since = since if since is not None else time.monotonic()
            return time.monotonic() - since >= STEADY_SECONDS

        try:
            await wait_until(
                steady_near_zero,
                timeout=self.plan.recovery_limit,
                what="lag near zero",
                interval=1.0,
            )
        except AssertionError:
            return None
        assert since is not None
        return round(max(0.0, since - ended), 1)

    async def _worker_kill9(self) -> str:
        """SIGKILL the workers alternately, while the victim has a compaction in
        flight if it gets one within 10 s; the supervisor restarts it, and the
        fault ends when the group has split the partitions again."""
        victim = self.stack.workers[self.kills % len(self.stack.workers)]
        self.kills += 1

        async def compacting() -> bool:
            return victim.alive and await victim.in_flight() > 0

        try:
            await wait_until(compacting, timeout=10, what="a compaction in flight", interval=0.1)
            mid = True
        except AssertionError:
            mid = False
        restarts = victim.restarts
        victim.sigkill()

        async def restarted() -> bool:
            return victim.restarts > restarts and victim.alive

        await wait_until(restarted, timeout=60, what=f"{victim.name} restarted")
        # The fault lasts until the supervisor's restart has its partitions back.
        await self.stack.wait_for_group(timeout=self.plan.recovery_limit)
        return f"{victim.name}{' mid-compaction' if mid else ''}, back in the group"

    async def _postgres_restart(self) -> str:
        await asyncio.to_thread(self.pg.stop_immediate)
        await asyncio.sleep(self.plan.outage_seconds)  # the outage itself
        await asyncio.to_thread(self.pg.start)
        await self.pg.wait_accepting()
        return f"stop -m immediate, {self.plan.outage_seconds:.0f}s down"

    async def _broker_restart(self) -> str:
        pid = self.broker.pid
        assert pid is not None and self.broker.is_running()
        os.killpg(pid, signal.SIGKILL)

        async def dead() -> bool:
            return not self.broker.is_running()

        await wait_until(dead, timeout=30, what="broker dead")
        await asyncio.sleep(self.plan.outage_seconds)  # the outage itself
        await asyncio.to_thread(self.broker.start)
        await asyncio.to_thread(self.broker.wait_ready, 120.0)
        return f"SIGKILL, {self.plan.outage_seconds:.0f}s down"

    async def _llm_storm(self) -> str:
        self.llm.start_storm(storm_actions(LLM_TIMEOUT_SECONDS), self.plan.storm_seconds)
        await asyncio.sleep(self.plan.storm_seconds)  # the storm itself
        self.llm.end_storm()
        return f"{self.plan.storm_seconds:.0f}s of failures"


# --------------------------------------------------------------------------- verdict


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope (units per second), None with fewer than 4 points."""
    if len(points) < 4 or len({x for x, _ in points}) < 2:
        return None
    return statistics.linear_regression([x for x, _ in points], [y for _, y in points]).slope


def _worker_line(
    samples: Sequence[Mapping[str, Any]], worker: str, key: str, half: float, *, floor: bool
) -> tuple[float | None, int]:
    """Slope of ``key`` through the second half's samples of ``worker``'s
    longest-lived process there (its first ``WARMUP_SECONDS`` left out). With
    ``floor``, through the lowest value of each eighth of those samples: open
    descriptors come and go with connections and requests, and a leak shows
    as a rising floor."""
    first_seen: dict[int, float] = {}
    by_pid: dict[int, list[tuple[float, float]]] = {}
    for s in samples:
        w = s["workers"].get(worker) or {}
        if not w:
            continue
        first_seen.setdefault(w["pid"], s["t"])
        if s["t"] >= half and s["t"] - first_seen[w["pid"]] >= WARMUP_SECONDS:
            by_pid.setdefault(w["pid"], []).append((s["t"], float(w[key])))
    if not by_pid:
        return None, 0
    points = max(by_pid.values(), key=lambda p: p[-1][0] - p[0][0])
    if floor:
        size = max(2, len(points) // 8)
        chunks = [points[i : i + size] for i in range(0, len(points), size)]
        points = [
            (statistics.fmean(t for t, _ in chunk), min(v for _, v in chunk)) for chunk in chunks
        ]
    return slope(points), len(points)


def _peaks(report: SoakReport) -> None:
    """Each fault's peak lag and over-budget count, until the next fault."""
    ends = [f.start for f in report.faults[1:]] + [report.traffic_seconds]
    for fault, until in zip(report.faults, ends, strict=True):
        window = [s for s in report.samples if fault.start <= s["t"] <= until]
        lags = [s["lag"] for s in window if s["lag"] is not None]
        overs = [s["over_budget"] for s in window if s["over_budget"] is not None]
        fault.peak_lag = max(lags) if lags else None
        fault.peak_over_budget = max(overs) if overs else None


def _quiet(report: SoakReport, t: float) -> bool:
    """Not between a fault's start and its lag's return near zero."""
    for f in report.faults:
        back = f.end + (f.lag_back_after if f.lag_back_after is not None else 1e9)
        if f.start <= t <= back:
            return False
    return True


def _at(samples: Sequence[Mapping[str, Any]], t: float) -> Mapping[str, Any] | None:
    """The first sample at or after ``t`` with the database's sizes."""
    for s in samples:
        if s["t"] >= t and s["tables"]:
            return s
    return None


def _last(samples: Sequence[Mapping[str, Any]], until: float) -> Mapping[str, Any] | None:
    with_tables = [s for s in samples if s["tables"] and s["t"] <= until]
    return with_tables[-1] if with_tables else None


def bytes_per_message(sample: Mapping[str, Any]) -> float:
    total = sum(t["total"] for t in sample["tables"].values())
    return total / max(1, sample["produced"])


def _growth_checks(report: SoakReport, half: float, span: float) -> list[Check]:
    limits = report.limits
    checks = []
    samples = [s for s in report.samples if s["t"] <= report.traffic_seconds]
    workers = sorted({name for s in samples for name in s["workers"]})
    for key, unit, limit, floor in (
        ("rss_mib", "MiB", limits.max_rss_growth_mib, False),
        ("fds", "fds", limits.max_fd_growth, True),
    ):
        for worker in workers:
            rate, n = _worker_line(samples, worker, key, half, floor=floor)
            if rate is None:
                checks.append(
                    Check(f"{key} {worker}", False, f"too few samples in the second half ({n})")
                )
                continue
            growth = rate * span
            checks.append(
                Check(
                    f"{key} {worker}",
                    growth <= limit,
                    f"{rate * 60:+.3f} {unit}/min over {n} samples: {growth:+.1f} {unit} "
                    f"over the second half (limit {limit:g})",
                )
            )
    return checks


def _lag_checks(report: SoakReport, half: float, span: float) -> list[Check]:
    near = report.limits.near_zero_lag(report.plan.rate)
    checks = []
    for i, f in enumerate(report.faults, 1):
        checks.append(
            Check(
                f"lag after fault {i} ({f.kind})",
                f.lag_back_after is not None,
                f"peak {f.peak_lag}, back to <= {near:.0f} "
                + (
                    f"not within {report.plan.recovery_limit:.0f}s"
                    if f.lag_back_after is None
                    else f"{f.lag_back_after:.0f}s after the fault ended"
                ),
            )
        )
    quiet = [
        (s["t"], float(s["lag"]))
        for s in report.samples
        if half <= s["t"] <= report.traffic_seconds
        and s["lag"] is not None
        and _quiet(report, s["t"])
    ]
    rate = slope(quiet)
    if rate is None:
        checks.append(Check("lag between faults", False, f"too few samples ({len(quiet)})"))
    else:
        checks.append(
            Check(
                "lag between faults",
                rate * span <= near,
                f"{rate * 60:+.1f} events/min over {len(quiet)} samples: {rate * span:+.0f} "
                f"over the second half (limit {near:.0f})",
            )
        )
    return checks


def _storage_checks(report: SoakReport, half: float) -> list[Check]:
    limits = report.limits
    mid, end = _at(report.samples, half), _last(report.samples, report.traffic_seconds)
    if mid is None or end is None or mid is end:
        return [Check("storage", False, "no database sizes sampled in the second half")]
    checks = _storage_figures(report, mid, end)
    if report.traffic_seconds < limits.storage_after_minutes * 60:
        for check in checks:
            check.ok = True
            check.detail += f" [not judged: run under {limits.storage_after_minutes:g} min]"
    return checks


def _storage_figures(
    report: SoakReport, mid: Mapping[str, Any], end: Mapping[str, Any]
) -> list[Check]:
    limits = report.limits
    checks = []
    mid_bpm, end_bpm = bytes_per_message(mid), bytes_per_message(end)
    checks.append(
        Check(
            "bytes per message",
            end_bpm <= limits.bytes_per_message_growth * mid_bpm,
            f"{mid_bpm:.0f} at {mid['t'] / 60:.1f} min -> {end_bpm:.0f} at "
            f"{end['t'] / 60:.1f} min (limit x{limits.bytes_per_message_growth:g})",
        )
    )
    live_mid, live_end = mid["tables"]["messages"]["total"], end["tables"]["messages"]["total"]
    checks.append(
        Check(
            "messages table (live context) bounded",
            live_end <= limits.messages_table_growth * live_mid + 4 * MiB,
            f"{live_mid / MiB:.1f} -> {live_end / MiB:.1f} MiB "
            f"(limit x{limits.messages_table_growth:g} + 4 MiB)",
        )
    )
    grown = []
    for name, sizes in end["tables"].items():
        before = mid["tables"].get(name)
        if sizes["total"] < MiB or not before or not before["heap"] or not sizes["heap"]:
            continue
        ratio_mid, ratio_end = before["index"] / before["heap"], sizes["index"] / sizes["heap"]
        if ratio_end > limits.index_ratio_growth * ratio_mid:
            grown.append(f"{name} {ratio_mid:.2f} -> {ratio_end:.2f}")
    checks.append(
        Check(
            "index / heap ratio",
            not grown,
            ", ".join(grown) or f"no table's ratio grew x{limits.index_ratio_growth:g}",
        )
    )
    return checks


def judge(report: SoakReport) -> list[Check]:
    """Every check of the verdict, from the samples, faults and invariants."""
    _peaks(report)
    half = report.traffic_seconds / 2
    span = report.traffic_seconds - half
    checks = [
        *_growth_checks(report, half, span),
        *_lag_checks(report, half, span),
        *_storage_checks(report, half),
    ]
    inv = report.invariants
    checks.append(
        Check(
            "invariants",
            bool(inv.get("ok")),
            "all hold "
            + f"{inv.get('recovered_after_seconds')}s after the traffic stopped"
            + f" ({inv.get('messages_produced')} messages)"
            if inv.get("ok")
            else f"{inv.get('violations')}\n{inv.get('describe')}\n{inv.get('unexpected_exits')}",
        )
    )
    return checks


@dataclass
class SoakReport:
    plan: Plan
    limits: Limits
    samples: list[dict[str, Any]]
    faults: list[Fault]
    traffic_seconds: float
    invariants: dict[str, Any]
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {
            "plan": asdict(self.plan),
            "limits": asdict(self.limits),
            "traffic_seconds": self.traffic_seconds,
            "verdict": "PASS" if self.ok else "FAIL",
            "checks": [asdict(c) for c in self.checks],
            "faults": [asdict(f) for f in self.faults],
            "invariants": self.invariants,
            "samples": self.samples,
        }


# --------------------------------------------------------------------------- output


def render(report: SoakReport, rows: int = 20) -> str:
    samples = report.samples
    step = max(1, len(samples) // rows)
    shown = [*samples[::step], *([samples[-1]] if samples and (len(samples) - 1) % step else [])]
    workers = sorted({name for s in samples for name in s["workers"]})
    headers = [
        "min",
        "produced",
        *[f"{w} MiB" for w in workers],
        *[f"{w} fds" for w in workers],
        "lag",
        "over budget",
        "db MiB",
        "B/message",
        "messages MiB",
        "load",
    ]
    body = []
    for s in shown:
        tables = s["tables"] or {}
        body.append(
            [
                f"{s['t'] / 60:.1f}",
                s["produced"],
                *[(s["workers"].get(w) or {}).get("rss_mib", "-") for w in workers],
                *[(s["workers"].get(w) or {}).get("fds", "-") for w in workers],
                "-" if s["lag"] is None else s["lag"],
                "-" if s["over_budget"] is None else s["over_budget"],
                f"{sum(t['total'] for t in tables.values()) / MiB:.1f}" if tables else "-",
                f"{bytes_per_message(s):.0f}" if tables else "-",
                f"{tables['messages']['total'] / MiB:.1f}" if "messages" in tables else "-",
                s.get("load_1min", "-"),
            ]
        )
    fault_rows = [
        [
            f.kind,
            f"{f.start / 60:.1f}",
            f"{f.end - f.start:.0f}",
            f.detail,
            f.peak_lag,
            "never" if f.lag_back_after is None else f"{f.lag_back_after:.0f}",
            f.peak_over_budget,
        ]
        for f in report.faults
    ]
    sizes = _last(samples, report.traffic_seconds)
    size_rows = []
    if sizes:
        for name, t in sorted(sizes["tables"].items(), key=lambda kv: -kv[1]["total"])[:10]:
            size_rows.append(
                [
                    name,
                    f"{t['total'] / MiB:.1f}",
                    f"{t['heap'] / MiB:.1f}",
                    f"{t['index'] / MiB:.1f}",
                    t["live_rows"],
                    t["dead_rows"],
                    f"{t['total'] / max(1, sizes['produced']):.0f}",
                ]
            )
    parts = [
        table(headers, body),
        "",
        table(
            ["fault", "at min", "s", "how", "peak lag", "lag ~0 after s", "peak over budget"],
            fault_rows,
        ),
        "",
        table(
            ["table", "total MiB", "heap MiB", "index MiB", "live rows", "dead rows", "B/message"],
            size_rows,
        ),
        "",
        *[f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}" for c in report.checks],
        "",
        f"verdict: {'PASS' if report.ok else 'FAIL'}",
    ]
    return "\n".join(parts)


def draw(report: SoakReport, out: Path) -> None:
    """RSS, descriptors, lag and over-budget, and bytes per message over time,
    with the faults marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report.samples
    workers = sorted({name for s in samples for name in s["workers"]})
    fig, axes = plt.subplots(2, 2, figsize=(13, 8), sharex=True)
    (rss, fds), (lag, storage) = axes

    def series(key: str, worker: str) -> tuple[list[float], list[float]]:
        xs, ys = [], []
        for s in samples:
            w = s["workers"].get(worker) or {}
            if w:
                xs.append(s["t"] / 60)
                ys.append(w[key])
        return xs, ys

    for worker in workers:
        rss.plot(*series("rss_mib", worker), ".-", ms=3, label=worker)
        fds.plot(*series("fds", worker), ".-", ms=3, label=worker)
    rss.set_title("worker RSS (MiB)")
    fds.set_title("worker open file descriptors")
    points = [(s["t"] / 60, s["lag"]) for s in samples if s["lag"] is not None]
    lag.plot([x for x, _ in points], [y for _, y in points], ".-", ms=3, label="consumer lag")
    lag.set_title("consumer lag (events) and conversations over budget")
    over = [(s["t"] / 60, s["over_budget"]) for s in samples if s["over_budget"] is not None]
    twin = lag.twinx()
    twin.plot([x for x, _ in over], [y for _, y in over], "r.", ms=3, label="over budget")
    twin.set_ylabel("over budget", color="r")
    sized = [s for s in samples if s["tables"] and s["produced"] >= 1000]  # past the empty tables
    names = (
        sorted(sized[-1]["tables"], key=lambda n: -sized[-1]["tables"][n]["total"])[:5]
        if sized
        else []
    )
    for name in names:
        storage.plot(
            [s["t"] / 60 for s in sized],
            [s["tables"].get(name, {}).get("total", 0) / s["produced"] for s in sized],
            ".-",
            ms=3,
            label=name,
        )
    storage.plot(
        [s["t"] / 60 for s in sized], [bytes_per_message(s) for s in sized], "k-", label="all"
    )
    storage.set_title("table size per message produced (bytes)")
    storage.set_yscale("log")
    colours = dict(zip(FAULTS, ("tab:red", "tab:purple", "tab:brown", "tab:olive"), strict=True))
    for ax in (rss, fds, lag, storage):
        for f in report.faults:
            ax.axvspan(f.start / 60, max(f.end, f.start + 3) / 60, color=colours[f.kind], alpha=0.3)
        ax.axvline(report.traffic_seconds / 120, color="grey", ls=":", lw=1)
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)
    for ax in (lag, storage):
        ax.set_xlabel(
            "minutes (shaded: faults, red kill, purple PostgreSQL, brown broker, olive LLM storm)"
        )
    plan = report.plan
    fig.suptitle(
        f"soak: {plan.minutes:g} min at {plan.rate:g} events/s over {plan.conversations} "
        f"conversations, {plan.llm_ms:g} ms LLM, a fault every {plan.fault_every:g} s: "
        f"{'PASS' if report.ok else 'FAIL'}"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def write_outputs(report: SoakReport, out_dir: Path) -> Path | None:
    """soak.json, and soak.png when matplotlib is there; the plot's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "soak.json").write_text(json.dumps(report.to_json(), indent=1))
    try:
        draw(report, out_dir / "soak.png")
    except ImportError:
        note("matplotlib missing (pip install -e '.[bench]'): no plot")
        return None
    return out_dir / "soak.png"


async def run_soak(
    plan: Plan,
    *,
    broker: KafkaBroker,
    pg: ControlledPostgres,
    dsn: str,
    llm: ChaosLLMServer,
    root: Path,
    limits: Limits | None = None,
    partial: Path | None = None,
) -> SoakReport:
    """The run and its verdict (``report.ok``); the caller owns the servers.
    ``partial``: a JSON file rewritten every minute with the samples so far."""
    soak = Soak(
        plan, broker=broker, pg=pg, dsn=dsn, llm=llm, root=root, limits=limits, partial=partial
    )
    await soak.run()
    report = SoakReport(
        plan, soak.limits, soak.samples, soak.faults, soak.traffic_seconds, soak.invariants
    )
    report.checks = judge(report)
    return report


async def _main_async(plan: Plan, limits: Limits, out: Path) -> SoakReport:
    from core.adapters.postgres.migrate import migrate

    root = Path(tempfile.mkdtemp(prefix="compactor-soak-"))
    broker = await asyncio.to_thread(start_local_broker, root, PARTITIONS)
    try:
        async with (
            own_server("compactor-soak-pg-") as pg,
            ChaosLLMServer(responder=short_summary) as llm,
        ):
            dsn = await pg.create_database("soak")
            await migrate(dsn)
            return await run_soak(
                plan,
                broker=broker,
                pg=pg,
                dsn=dsn,
                llm=llm,
                root=root,
                limits=limits,
                partial=out / "soak-partial.json",
            )
    finally:
        await asyncio.to_thread(broker.stop)
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=500.0, help="message events a second")
    parser.add_argument("--conversations", type=int, default=5000)
    parser.add_argument("--fault-every", type=float, default=180.0, help="seconds")
    parser.add_argument("--llm-ms", type=float, default=300.0)
    parser.add_argument("--sample-every", type=float, default=10.0, help="seconds")
    parser.add_argument("--storm-seconds", type=float, default=20.0)
    parser.add_argument(
        "--compaction-slots",
        type=int,
        default=None,
        help="[service].max_concurrent_compactions per worker (default: the chaos stack's 8)",
    )
    parser.add_argument("--out", type=Path, default=Path("soak-out"))
    parser.add_argument("--max-rss-growth-mib", type=float, default=Limits.max_rss_growth_mib)
    parser.add_argument("--max-fd-growth", type=float, default=Limits.max_fd_growth)
    parser.add_argument("--near-zero-lag-seconds", type=float, default=Limits.near_zero_lag_seconds)
    args = parser.parse_args(argv)
    plan = Plan(
        minutes=args.minutes,
        rate=args.rate,
        conversations=args.conversations,
        fault_every=args.fault_every,
        llm_ms=args.llm_ms,
        sample_every=args.sample_every,
        storm_seconds=args.storm_seconds,
        compaction_slots=args.compaction_slots,
    )
    limits = Limits(
        max_rss_growth_mib=args.max_rss_growth_mib,
        max_fd_growth=args.max_fd_growth,
        near_zero_lag_seconds=args.near_zero_lag_seconds,
    )
    print_header("Soak: a long run at a steady rate with faults", "bench.soak")
    report = asyncio.run(_main_async(plan, limits, args.out))
    print(render(report))
    plot = write_outputs(report, args.out)
    print(f"\nwrote {args.out / 'soak.json'}" + (f" and {plot}" if plot else ""))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
