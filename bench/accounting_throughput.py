"""How fast one worker's accounting agent takes in message events, against
baselines measured in the same run on the same machine.

N message events over C conversations (budget high: no compactions) are
written to a fresh messages topic first; then each reader drains that same
backlog and is timed from its first event to its last:

* kafka read        a plain aiokafka consumer, bytes only (the ceiling);
* kafka + decode    the same, plus what the agent does in Python per event
                    (pydantic validation, ``to_message``, token estimate);
* asyncpg INSERT    a plain INSERT of each row, one at a time, on one held
                    connection (the PostgreSQL round-trip floor), then through
                    ``pool.fetchval`` (asyncpg resets a connection on release),
                    then 100 rows per statement (what batching would buy);
* PostgresStore     what the agent asks of PostgreSQL, through the real store:
                    one message at a time (``save_messages`` of one), plus
                    the stored counts of a conversation's first event
                    (``totals_of``);
* Faust floor       ``bench.faust_floor``: the same Faust app settings with
                    an agent that does nothing, then one that only writes
                    the table (changelog-backed; memory://, then ``--store``);
* worker            ``compactor worker`` in a subprocess, polled on
                    /metrics (compactor_events_in_total) every 50 ms, once per
                    ``--batch-max`` value ([service].accounting_batch_max),
                    each with a fresh consumer group and database; after it
                    drains: the table writes per event
                    (compactor_table_writes_total), the mean accounted group
                    (compactor_accounting_batch_events) and a count of the
                    messages PostgreSQL holds (every one must be there);
* dense shape       the same backlog size over ``--dense-conversations``
                    conversations (many events each: table writes coalesce),
                    with its own Faust no-op floor and worker sweep;
* scale-out         one, then two workers (one consumer group, one config,
                    one database) on fresh topics: they start, the partitions
                    are split, each accounts a warm-up event per partition,
                    they are frozen (SIGSTOP) while the backlog is produced
                    and thawed together; timed from the first event either
                    counted to the last. Both share the same CPUs here
                    (their CPU % is printed).

Ratios to the Faust floor are within a shape, measured in the same run.
``--json FILE`` writes every figure for ``bench.plot``.

Each Faust process is a subprocess with its own consumer group, timed from
its first event to its last: the floors by their own clock, the worker by
polling. ``--pg-only`` runs only the PostgreSQL
rows (no Kafka, no Faust).

    python -m bench.accounting_throughput [--events 20000] [--conversations 2000]
        [--dense-conversations 200] [--batch-max 1 10 100 500 2000] [--json out.json]
    python -m bench.accounting_throughput --quick
    python -m bench.accounting_throughput --pg-only
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from bench.harness import (
    CpuMeter,
    FloorProcess,
    Infra,
    create_topics,
    message_event,
    new_worker,
    note,
    print_header,
    produce,
    running,
    table,
    unique_prefix,
    wait_assigned,
    worker_config,
    worker_metrics,
)
from bench.harness import _git_revision as git_revision
from core.adapters.postgres.connection import configure_connection
from core.adapters.postgres.store import PostgresStore
from core.domain.tokens import estimate_message_tokens
from core.ports.storage import IncomingMessage
from core.settings import ServiceSettings
from streams.events import MessageEvent
from tests.support.stores import saved, totals
from tests.support.worker import WorkerProcess, terminate_all, wait_for_split

try:  # a stretched flush interval (absent from older checkouts: none)
    from streams.worker.tally_table import MAX_STRETCH_SECONDS
except ImportError:
    MAX_STRETCH_SECONDS = 0.0

INSERT_SQL = """
INSERT INTO messages (id, conversation_id, role, content, tool_calls,
                      tool_call_id, created_at, token_estimate)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (conversation_id, id) DO NOTHING
RETURNING id
"""


@dataclass
class Measured:
    label: str
    events: int
    seconds: float
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("inf")

    @property
    def micros(self) -> float:
        return self.seconds / self.events * 1e6


def make_events(n: int, conversations: int, run: str) -> list[MessageEvent]:
    """Round robin over the conversations; every message counts 20 tokens."""
    return [
        message_event(f"{run}-c{i % conversations:06d}", i // conversations, token_count=20)
        for i in range(n)
    ]


# --------------------------------------------------------------------------- Kafka baselines


async def kafka_read(
    bootstrap: str, topic: str, partitions: int, expected: int, meter: CpuMeter, *, decode: bool
) -> Measured:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        count = 0
        last = 0.0
        tokens = 0
        meter.start()
        first = time.perf_counter()
        while count < expected:
            batches = await consumer.getmany(timeout_ms=2000)
            if not batches and count:
                raise RuntimeError(f"topic {topic} ended after {count} of {expected} records")
            for records in batches.values():
                for record in records:
                    if decode:
                        parsed = MessageEvent.model_validate_json(record.value)
                        message = parsed.to_message()
                        tokens += (
                            parsed.token_count
                            if parsed.token_count is not None
                            else estimate_message_tokens(message)
                        )
                    count += 1
            last = time.perf_counter()
        cpu = meter.stop()
    finally:
        await consumer.stop()
    label = "kafka read + decode (pydantic, estimate)" if decode else "kafka read (plain aiokafka)"
    return Measured(label, count, last - first, cpu)


# --------------------------------------------------------------------------- PostgreSQL baselines


def insert_args(event: MessageEvent) -> tuple[object, ...]:
    return (
        event.message_id,
        event.conversation_id,
        event.role,
        event.content,
        None,
        event.tool_call_id,
        event.created_at,
        event.token_count if event.token_count is not None else 0,
    )


async def pg_insert_loop(
    dsn: str, events: list[MessageEvent], meter: CpuMeter, *, pooled: bool
) -> Measured:
    """The plain INSERT, one row at a time: on one held connection, or through
    ``pool.fetchval``, where asyncpg resets the connection (one more round trip)
    every time it goes back to the pool."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=10, init=configure_connection)
    try:
        held = await pool.acquire()
        run: Any = pool if pooled else held
        if pooled:
            await pool.release(held)
        try:
            meter.start()
            started = time.perf_counter()
            for event in events:
                await run.fetchval(INSERT_SQL, *insert_args(event))
            seconds = time.perf_counter() - started
            cpu = meter.stop()
        finally:  # a held connection never released makes pool.close() wait forever
            if not pooled:
                await pool.release(held)
    finally:
        await pool.close()
    how = "pool.fetchval" if pooled else "one held connection"
    return Measured(f"asyncpg INSERT loop ({how})", len(events), seconds, cpu)


BATCH_INSERT_SQL = """
INSERT INTO messages (id, conversation_id, role, content, tool_calls,
                      tool_call_id, created_at, token_estimate)
SELECT id, conversation_id, role, content, NULL, NULL, created_at, token_estimate
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[], $6::int[])
       AS t(id, conversation_id, role, content, created_at, token_estimate)
ON CONFLICT (conversation_id, id) DO NOTHING
"""


async def pg_batch_insert(
    dsn: str, events: list[MessageEvent], meter: CpuMeter, batch: int
) -> Measured:
    """What batching would buy: ``batch`` rows per statement (one round trip)."""
    conn = await asyncpg.connect(dsn)
    try:
        meter.start()
        started = time.perf_counter()
        for i in range(0, len(events), batch):
            chunk = events[i : i + batch]
            await conn.execute(
                BATCH_INSERT_SQL,
                [e.message_id for e in chunk],
                [e.conversation_id for e in chunk],
                [e.role for e in chunk],
                [e.content for e in chunk],
                [e.created_at for e in chunk],
                [e.token_count or 0 for e in chunk],
            )
        seconds = time.perf_counter() - started
        cpu = meter.stop()
    finally:
        await conn.close()
    return Measured(f"asyncpg INSERT, {batch} rows per statement", len(events), seconds, cpu)


async def pg_store_calls(dsn: str, events: list[MessageEvent], meter: CpuMeter) -> Measured:
    """What the agent asks of PostgreSQL, one message at a time, through the real
    ``PostgresStore``: ``save_messages`` of one, and for a conversation's first
    event its stored counts (``totals_of``)."""
    store = await PostgresStore.connect(dsn, run_migrations=False)
    seen: set[str] = set()
    try:
        meter.start()
        started = time.perf_counter()
        for event in events:
            message = event.to_message()
            tokens = event.token_count
            await saved(
                store, message, tokens if tokens is not None else estimate_message_tokens(message)
            )
            if event.conversation_id not in seen:
                seen.add(event.conversation_id)
                await totals(store, event.conversation_id)
        seconds = time.perf_counter() - started
        cpu = meter.stop()
    finally:
        await store.close()
    return Measured("PostgresStore calls, as the agent makes them", len(events), seconds, cpu)


async def pg_save_groups(
    dsn: str, events: list[MessageEvent], meter: CpuMeter, group: int, *, per_conversation: bool
) -> Measured:
    """What the grouped agent asks of PostgreSQL: ``save_messages`` per group of
    ``group`` events, and ``totals_of`` for the group's conversations seen for
    the first time. ``per_conversation``: [postgres].single_conversation_transactions,
    one transaction per conversation of the group (docs/scaling.md)."""
    store = await PostgresStore.connect(
        dsn, run_migrations=False, single_conversation_transactions=per_conversation
    )
    seen: set[str] = set()
    try:
        meter.start()
        started = time.perf_counter()
        for i in range(0, len(events), group):
            chunk = events[i : i + group]
            await store.ingest.save_messages([incoming_of(e) for e in chunk])
            new = {e.conversation_id for e in chunk} - seen
            if new:
                seen |= new
                await store.tallies.totals_of(new)
        seconds = time.perf_counter() - started
        cpu = meter.stop()
    finally:
        await store.close()
    mode = "a transaction per conversation" if per_conversation else "one transaction"
    return Measured(f"save_messages, groups of {group}, {mode}", len(events), seconds, cpu)


def incoming_of(event: MessageEvent) -> IncomingMessage:
    message = event.to_message()
    tokens = event.token_count
    return IncomingMessage(
        message, tokens if tokens is not None else estimate_message_tokens(message)
    )


# --------------------------------------------------------------------------- Faust processes


def meter_for(infra: Infra, pid: int) -> CpuMeter:
    return CpuMeter({"reader": pid, "broker": infra.broker_pid, "postgres": infra.postgres_pid})


Proc = WorkerProcess | FloorProcess


async def timed_count(
    label: str,
    procs: Sequence[Proc],
    expected: int,
    count_of: Callable[[], Awaitable[float]],
    meter: CpuMeter,
    timeout: float,
    *,
    own_clock: bool = False,
) -> Measured:
    """Poll ``count_of`` every 50 ms; time from the first event counted to the last.

    ``own_clock``: the reader times itself (the floors), polling only meters CPU,
    so a backlog drained within one poll is no error."""
    deadline = time.monotonic() + timeout
    first: tuple[float, float] | None = None  # (time, count)
    count = 0.0
    now = time.perf_counter()
    while True:
        for proc in procs:
            if not proc.alive:
                raise RuntimeError(f"{label}: {proc.name} exited; log:\n{proc.log_tail()}")
        count = await count_of()
        now = time.perf_counter()
        if count >= 1 and first is None:
            first = (now, count)
            meter.start()
        if count >= expected:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{label}: only {count:.0f} of {expected} events counted")
        await asyncio.sleep(0.05)
    cpu = meter.stop()
    assert first is not None
    if count - first[1] < 1:
        if not own_clock:
            raise RuntimeError(f"{label} drained the topic within one poll: use more --events")
        cpu = {}  # a window of one poll says nothing about CPU
    return Measured(label, int(count - first[1]), now - first[0], cpu)


async def drain(
    infra: Infra,
    proc: Proc,
    label: str,
    topic: str,
    args: argparse.Namespace,
    expected: int,
    count_of: Callable[[], Awaitable[float]],
    *,
    own_clock: bool = False,
) -> Measured:
    """Time a Faust process from its first event counted to its last (polled every 50 ms)."""
    await wait_assigned(proc, topic, args.partitions)
    note(f"{label}: ready; draining the backlog")
    meter = meter_for(infra, proc.pid)
    return await timed_count(
        label, [proc], expected, count_of, meter, args.timeout, own_clock=own_clock
    )


async def faust_floor(
    infra: Infra, topic: str, args: argparse.Namespace, mode: str, store: str, expected: int
) -> Measured:
    proc = FloorProcess(
        infra,
        f"floor-{mode}-{store[:-3]}-{topic.rsplit('.', 2)[0][-8:]}",
        [
            "--topic",
            topic,
            "--partitions",
            str(args.partitions),
            "--mode",
            mode,
            "--store",
            store,
            "--linger-ms",
            str(args.linger_ms),
        ],
    )

    async def count_of() -> float:
        return float((await proc.get_json("/count"))["count"])

    label = (
        "Faust agent, no-op (floor)"
        if mode == "noop"
        else f"Faust agent, table write only ({store})"
    )
    with running(proc):
        polled = await drain(infra, proc, label, topic, args, expected, count_of, own_clock=True)
        # The floor timed itself (first event to last, in its own process): exact,
        # where polling is coarse for a reader this fast.
        own = await proc.get_json("/count")
    return Measured(label, own["count"] - 1, own["last_at"] - own["first_at"], polled.cpu)


#: The installed worker's accounting settings (the batched agent adds them; the
#: configuration refuses unknown keys, so they are only sent when it has them).
BATCHED = "accounting_batch_max" in ServiceSettings.model_fields
FLUSHED = "table_flush_seconds" in ServiceSettings.model_fields


def accounting_config(
    prefix: str, args: argparse.Namespace, batch_max: int | None
) -> dict[str, dict[str, Any]]:
    config = worker_config(topic_prefix=prefix, partitions=args.partitions, store=args.store)
    if BATCHED and batch_max is not None:
        config["service"]["accounting_batch_max"] = batch_max
    if FLUSHED and args.table_flush_seconds is not None:
        config["service"]["table_flush_seconds"] = args.table_flush_seconds
    return config


def linger_env(args: argparse.Namespace) -> dict[str, str] | None:
    # Faust reads PRODUCER_LINGER (seconds) from the environment; unset, it is 0.
    return {"PRODUCER_LINGER": str(args.linger_ms / 1000)} if args.linger_ms else None


async def events_in(worker: WorkerProcess) -> float:
    metrics = await worker_metrics(worker)
    for outcome in ("duplicate", "dead_lettered"):
        wrong = metrics.get(f'compactor_events_in_total{{outcome="{outcome}"}}', 0.0)
        if wrong:
            raise RuntimeError(
                f"{worker.name}: {wrong:.0f} events were {outcome.replace('_', ' ')}; "
                f"log:\n{worker.log_tail()}"
            )
    return metrics.get("compactor_events_in_total", 0.0)


async def stored_messages(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM messages"))
    finally:
        await conn.close()


@dataclass
class WorkerRun:
    """One worker draining one shape's backlog at one accounting_batch_max."""

    shape: str
    batch_max: int | None
    measured: Measured
    events_total: float
    table_writes: float | None
    batch_sum: float | None
    batch_count: float | None
    stored: int
    expected: int
    audit: CommitAudit | None = None

    @property
    def writes_per_event(self) -> float | None:
        if self.table_writes is None or not self.events_total:
            return None
        return self.table_writes / self.events_total

    @property
    def mean_batch(self) -> float | None:
        if not self.batch_count or self.batch_sum is None:
            return None
        return self.batch_sum / self.batch_count


async def worker_drain(
    infra: Infra,
    prefix: str,
    args: argparse.Namespace,
    expected: int,
    batch_max: int | None = None,
    shape: str = "",
) -> WorkerRun:
    config = accounting_config(prefix, args, batch_max)
    dsn = await infra.new_database()
    name = f"worker-{shape}-b{batch_max}" if batch_max is not None else f"worker-{shape}"
    worker = new_worker(infra, name, dsn, config, linger_env(args))
    label = f"worker accounting agent ({args.store})"
    if BATCHED and batch_max is not None:
        label = f"worker, accounting_batch_max={batch_max} ({args.store})"
    topic = f"{prefix}messages"
    audit = CommitAudit(infra, config["service"]["app_id"], topic, dsn)
    with running(worker):
        auditing = asyncio.create_task(audit.run())
        try:
            measured = await drain(
                infra, worker, label, topic, args, expected, lambda: events_in(worker)
            )
            # Dirty entries reach the table every table_flush_seconds, or up to
            # MAX_STRETCH_SECONDS after a large flush, and offsets are committed after
            # that: wait for the last commit (the table's last flush) before counting.
            await audit.committed(
                expected, within=MAX_STRETCH_SECONDS + 1.5 * (args.table_flush_seconds or 1.0) + 2
            )
            metrics = await worker_metrics(worker)
        finally:
            audit.stop.set()
            await auditing
    stored = await stored_messages(dsn)
    if audit.violations:
        note(f"{label}: {audit.violations} samples had more offsets committed than rows stored")
    if stored != expected:
        note(f"{label}: PostgreSQL holds {stored} messages, expected {expected}")
    return WorkerRun(
        shape=shape,
        batch_max=batch_max if BATCHED else None,
        measured=measured,
        events_total=metrics.get("compactor_events_in_total", 0.0),
        table_writes=metrics.get("compactor_table_writes_total"),
        batch_sum=metrics.get("compactor_accounting_batch_events_sum"),
        batch_count=metrics.get("compactor_accounting_batch_events_count"),
        stored=stored,
        expected=expected,
        audit=audit,
    )


class CommitAudit:
    """Every message stored before its offset is committed: sampled every 200 ms,
    the consumer group's committed offsets (read first) never exceed the rows
    PostgreSQL holds (counted after). The topic holds only the backlog, from
    offset 0, so the committed offsets summed are the messages committed."""

    def __init__(self, infra: Infra, group: str, topic: str, dsn: str) -> None:
        assert infra.bootstrap is not None
        self.bootstrap = infra.bootstrap
        self.group, self.topic, self.dsn = group, topic, dsn
        self.stop = asyncio.Event()
        self.samples = 0
        self.violations = 0
        self.worst = 0  # the largest committed − stored seen (> 0 is a violation)
        self.last_committed = 0

    async def run(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        conn = await asyncpg.connect(self.dsn)
        try:
            while True:
                try:
                    offsets = await admin.list_consumer_group_offsets(self.group)
                except Exception:  # the group is not there yet
                    offsets = {}
                committed = sum(
                    max(0, meta.offset) for tp, meta in offsets.items() if tp.topic == self.topic
                )
                stored = int(await conn.fetchval("SELECT count(*) FROM messages"))
                self.samples += 1
                self.last_committed = committed
                if committed > stored:
                    self.violations += 1
                self.worst = max(self.worst, committed - stored)
                if self.stop.is_set():
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), 0.2)
        finally:
            await conn.close()
            await admin.close()

    async def committed(self, expected: int, *, within: float) -> None:
        """Until the group has committed ``expected`` offsets (its last flush and
        commit), or ``within`` seconds: the figures are read either way."""
        deadline = time.monotonic() + within
        while self.last_committed < expected and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 0.2)

    def describe(self) -> str:
        verdict = "ok" if not self.violations else f"{self.violations} BAD"
        return f"{verdict} ({self.samples} samples, {self.last_committed} committed at the end)"


def one_key_per_partition(args: argparse.Namespace) -> list[str]:
    """A conversation id for each partition of the messages topic (murmur2, as
    every Kafka client partitions a key)."""
    from aiokafka.partitioner import DefaultPartitioner

    partitioner = DefaultPartitioner()
    every = list(range(args.partitions))
    found: dict[int, str] = {}
    i = 0
    while len(found) < args.partitions:
        cid = f"warm-{i:04d}"
        found.setdefault(partitioner(cid.encode(), every, every), cid)
        i += 1
    return [found[p] for p in every]


async def wait_total(workers: Sequence[WorkerProcess], expected: int, within: float) -> None:
    deadline = time.monotonic() + within
    while sum(await asyncio.gather(*(events_in(w) for w in workers))) < expected:
        if time.monotonic() > deadline:
            raise TimeoutError(f"warm-up events not accounted within {within:.0f}s")
        await asyncio.sleep(0.1)


@dataclass
class ScaleRun:
    workers: int
    partitions: list[list[int]]
    measured: Measured
    produce_seconds: float
    per_worker_events: list[float]


async def scale_out(
    infra: Infra, args: argparse.Namespace, events: list[MessageEvent], n: int
) -> ScaleRun:
    """``n`` workers of one service (one consumer group, one config, one database) on
    fresh topics: wait until the partitions are split and every worker is warm,
    freeze them, produce the backlog, thaw them together and time the drain."""
    assert infra.bootstrap is not None
    prefix = unique_prefix(f"scale{n}")
    names = await create_topics(infra.bootstrap, prefix, args.partitions)
    config = accounting_config(prefix, args, args.scale_out_batch)
    dsn = await infra.new_database()
    workers = [new_worker(infra, f"scale{n}-w{i}", dsn, config, linger_env(args)) for i in range(n)]
    label = f"{n} worker{'s' if n > 1 else ''}, accounting_batch_max={args.scale_out_batch}"
    frozen = False
    try:
        for worker in workers:
            worker.start()
        if n == 1:
            await wait_assigned(workers[0], names.messages, args.partitions)
            split = [set(range(args.partitions))]
        else:
            split = await wait_for_split(workers, names.messages, args.partitions, timeout=180.0)
        # One event per partition first, so every worker has opened its PostgreSQL
        # pool (the runtime opens at the first event) before the clock runs.
        warm = [message_event(cid, 0, token_count=20) for cid in one_key_per_partition(args)]
        await produce(infra.bootstrap, names.messages, warm)
        await wait_total(workers, len(warm), args.timeout)
        note(f"{label}: partitions {[sorted(p) for p in split]}, warmed up; producing the backlog")
        meter = CpuMeter(
            {
                **{f"worker {i + 1}": w.pid for i, w in enumerate(workers)},
                "broker": infra.broker_pid,
                "postgres": infra.postgres_pid,
            }
        )
        last: list[float] = [0.0] * n

        async def count_of() -> float:
            counts = await asyncio.gather(*(events_in(w) for w in workers))
            last[:] = [c - len(p) for c, p in zip(counts, split, strict=True)]
            return sum(last)

        # Frozen (SIGSTOP) while the backlog is written, then thawed together: each
        # worker drains a backlog waiting in its partitions, as in the sweep. A few
        # seconds frozen are far inside the consumer session timeout.
        for worker in workers:
            os.kill(worker.pid, signal.SIGSTOP)
        frozen = True
        _, produce_seconds = await produce(infra.bootstrap, names.messages, events)
        for worker in workers:
            os.kill(worker.pid, signal.SIGCONT)
        frozen = False
        measured = await timed_count(label, workers, len(events), count_of, meter, args.timeout)
    finally:
        if frozen:
            for worker in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGCONT)
        terminate_all(workers)
    stored = await stored_messages(dsn) - len(warm)
    if stored != len(events):
        note(f"{label}: PostgreSQL holds {stored} messages, expected {len(events)}")
    return ScaleRun(n, [sorted(p) for p in split], measured, produce_seconds, list(last))


# --------------------------------------------------------------------------- main


PARTS = ("baselines", "sweep", "dense", "scale-out")


@dataclass
class ShapeResult:
    name: str
    events: int
    conversations: int
    floor: Measured | None = None
    floor_after: Measured | None = None  # the same floor again, after the worker sweep
    workers: list[WorkerRun] = field(default_factory=list)

    @property
    def floor_rate(self) -> float | None:
        """The floor's rate over both of its runs (events ÷ mean seconds): the floor
        alone moved 2.2–5.2 s between runs of a day, before and after a sweep
        brackets the machine's state while the workers ran."""
        runs = [m for m in (self.floor, self.floor_after) if m is not None]
        if not runs:
            return None
        return sum(m.events for m in runs) / sum(m.seconds for m in runs)


@dataclass
class Results:
    rows: list[Measured] = field(default_factory=list)
    shapes: list[ShapeResult] = field(default_factory=list)
    scale: list[ScaleRun] = field(default_factory=list)


async def produce_backlog(
    infra: Infra, args: argparse.Namespace, tag: str, events: list[MessageEvent]
) -> str:
    """A fresh topic prefix holding ``events`` in its messages topic."""
    assert infra.bootstrap is not None
    prefix = unique_prefix(tag)
    names = await create_topics(infra.bootstrap, prefix, args.partitions)
    note(f"producing {len(events)} events to {names.messages}")
    count, seconds = await produce(infra.bootstrap, names.messages, events)
    note(f"produced {count} events in {seconds:.1f}s ({count / seconds:.0f}/s)")
    return prefix


async def sweep(infra: Infra, args: argparse.Namespace, shape: ShapeResult, prefix: str) -> None:
    """The no-op floor, then the worker at every batch size, on one backlog."""
    topic = f"{prefix}messages"
    shape.floor = await faust_floor(infra, topic, args, "noop", "memory://", shape.events)
    for batch_max in args.batch_max if BATCHED else [None]:
        shape.workers.append(
            await worker_drain(infra, prefix, args, shape.events, batch_max, shape.name)
        )
    shape.floor_after = await faust_floor(infra, topic, args, "noop", "memory://", shape.events)


async def run(args: argparse.Namespace, infra: Infra) -> Results:
    run_id = f"r{int(time.time()) % 100000}"
    events = make_events(args.events, args.conversations, run_id)
    results = Results()
    rows = results.rows
    parts = set(args.parts)
    prefix = ""
    if not args.pg_only and parts & {"baselines", "sweep"}:
        assert infra.bootstrap is not None
        prefix = await produce_backlog(infra, args, "acct", events)
    if "baselines" in parts and not args.pg_only:
        assert infra.bootstrap is not None
        for decode in (False, True):
            rows.append(
                await kafka_read(
                    infra.bootstrap,
                    f"{prefix}messages",
                    args.partitions,
                    len(events),
                    meter_for(infra, os.getpid()),
                    decode=decode,
                )
            )
    if "baselines" in parts:
        note("PostgreSQL baselines")
        for pooled in (False, True):
            meter = meter_for(infra, os.getpid())
            dsn = await infra.new_database()
            rows.append(await pg_insert_loop(dsn, events, meter, pooled=pooled))
        meter = meter_for(infra, os.getpid())
        rows.append(await pg_batch_insert(await infra.new_database(), events, meter, 100))
        meter = meter_for(infra, os.getpid())
        rows.append(await pg_store_calls(await infra.new_database(), events, meter))
        for per_conversation in (False, True):
            meter = meter_for(infra, os.getpid())
            dsn = await infra.new_database()
            rows.append(
                await pg_save_groups(dsn, events, meter, 50, per_conversation=per_conversation)
            )
    if args.pg_only:
        return results
    topic = f"{prefix}messages"
    if "baselines" in parts:
        for store in dict.fromkeys(["memory://", args.store]):
            rows.append(await faust_floor(infra, topic, args, "table", store, len(events)))
    if "sweep" in parts:
        main = ShapeResult(f"{args.conversations}c", len(events), args.conversations)
        results.shapes.append(main)
        await sweep(infra, args, main, prefix)
        if main.floor is not None:  # where it always was: before the table-write floors
            at = next((i for i, r in enumerate(rows) if "table write" in r.label), len(rows))
            rows.insert(at, main.floor)
        rows.extend(w.measured for w in main.workers)
    if args.dense_conversations and "dense" in parts:
        dense_events = make_events(args.events, args.dense_conversations, run_id + "d")
        dense = ShapeResult(
            f"{args.dense_conversations}c", len(dense_events), args.dense_conversations
        )
        results.shapes.append(dense)
        await sweep(infra, args, dense, await produce_backlog(infra, args, "dense", dense_events))
    if args.scale_out_batch and "scale-out" in parts:
        for n in (1, 2):
            results.scale.append(await scale_out(infra, args, events, n))
    return results


def pct(cpu: dict[str, float], key: str) -> str:
    return f"{cpu[key]:.0f}%" if key in cpu else "-"


def report(results: list[Measured], store: str) -> None:
    if not results:
        return
    baseline = results[0]
    rows = [
        (
            r.label,
            r.events,
            f"{r.seconds:.2f}",
            f"{r.rate:,.0f}",
            f"{r.micros:.0f}",
            f"{r.rate / baseline.rate:.3f}",
            pct(r.cpu, "reader"),
            pct(r.cpu, "broker"),
            pct(r.cpu, "postgres"),
            pct(r.cpu, "machine"),
        )
        for r in results
    ]
    headers = (
        "reader",
        "events",
        "seconds",
        "events/s",
        "µs/event",
        "rate ÷ row 1",
        "reader CPU",
        "broker CPU",
        "postgres CPU",
        "machine busy",
    )
    print(table(headers, rows))
    print(
        "\nCPU columns: percent of one core used by the reader process (this process for the"
        " in-process rows), the Kafka broker and PostgreSQL (process trees, only when this run"
        " started them) during the timed window; machine busy: percent of all cores, whoever"
        " used them."
    )
    worker = next((r for r in results if r.label.startswith("worker")), None)
    parts = {
        "read + decode": next((r for r in results if "decode" in r.label), None),
        "PostgresStore": next((r for r in results if "PostgresStore" in r.label), None),
        "Faust + table": next(
            (r for r in results if "table write" in r.label and r.label.endswith(f"({store})")),
            None,
        ),
    }
    if worker and all(parts.values()) and not BATCHED:
        known = sum(r.micros for r in parts.values() if r)
        shares = " + ".join(f"{name} {r.micros:.0f}" for name, r in parts.items() if r)
        print(
            f"\nper event in the worker: {worker.micros:.0f} µs; its parts measured alone: "
            f"{shares} = {known:.0f} µs; not explained by them: {worker.micros - known:.0f} µs"
        )


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report_shapes(shapes: list[ShapeResult]) -> None:
    rows = []
    for shape in shapes:
        floor_rate = shape.floor_rate
        floors = (("Faust no-op floor", shape.floor), ("floor again, after", shape.floor_after))
        for label, floor in floors:
            if floor is None:
                continue
            rows.append(
                (
                    f"{shape.events} / {shape.conversations}",
                    label,
                    floor.events,
                    f"{floor.seconds:.2f}",
                    f"{floor.rate:,.0f}",
                    fmt(floor.rate / floor_rate if floor_rate else None, ".3f"),
                    "-",
                    "-",
                    "-",
                    "-",
                    pct(floor.cpu, "reader"),
                    pct(floor.cpu, "broker"),
                    pct(floor.cpu, "postgres"),
                    pct(floor.cpu, "machine"),
                )
            )
        for w in shape.workers:
            m = w.measured
            rows.append(
                (
                    f"{shape.events} / {shape.conversations}",
                    "worker" if w.batch_max is None else f"worker, batch_max {w.batch_max}",
                    m.events,
                    f"{m.seconds:.2f}",
                    f"{m.rate:,.0f}",
                    fmt(m.rate / floor_rate if floor_rate else None, ".3f"),
                    fmt(w.writes_per_event, ".3f"),
                    fmt(w.mean_batch, ".1f"),
                    f"{w.stored}/{w.expected}",
                    w.audit.describe() if w.audit else "-",
                    pct(m.cpu, "reader"),
                    pct(m.cpu, "broker"),
                    pct(m.cpu, "postgres"),
                    pct(m.cpu, "machine"),
                )
            )
    print(
        table(
            (
                "events / conversations",
                "reader",
                "events",
                "seconds",
                "events/s",
                "÷ floor",
                "table writes/event",
                "mean group",
                "in PostgreSQL",
                "stored before committed",
                "reader CPU",
                "broker CPU",
                "postgres CPU",
                "machine busy",
            ),
            rows,
        )
    )
    print(
        "\n÷ floor: the worker's rate over the Faust no-op agent's on the same backlog in this"
        " run, the agent run before and after the workers (events ÷ their mean seconds)."
        " table writes/event: compactor_table_writes_total ÷ compactor_events_in_total;"
        " mean group: compactor_accounting_batch_events sum ÷ count (events per accounted"
        " group); in PostgreSQL: messages stored in the worker's database afterwards;"
        " stored before committed: every 200 ms the consumer group's committed offsets"
        " (read first) were at most the rows PostgreSQL held (counted after)."
        + ("" if BATCHED else " (This worker has no accounting_batch_max: one row per shape.)")
    )


def report_scale(scale: list[ScaleRun]) -> None:
    one = next((s for s in scale if s.workers == 1), None)
    rows = []
    for s in scale:
        m = s.measured
        worker_cpu = [
            f"{m.cpu[f'worker {i + 1}']:.0f}%"
            for i in range(s.workers)
            if f"worker {i + 1}" in m.cpu
        ]
        rows.append(
            (
                s.workers,
                " | ".join(",".join(map(str, p)) for p in s.partitions),
                " | ".join(f"{e:.0f}" for e in s.per_worker_events),
                m.events,
                f"{m.seconds:.2f}",
                f"{m.rate:,.0f}",
                fmt(m.rate / one.measured.rate if one else None, ".2f"),
                " | ".join(worker_cpu),
                pct(m.cpu, "broker"),
                pct(m.cpu, "postgres"),
                pct(m.cpu, "machine"),
                f"{s.produce_seconds:.2f}",
            )
        )
    print(
        table(
            (
                "workers",
                "partitions each",
                "events each",
                "events",
                "seconds",
                "events/s (all)",
                "÷ 1 worker",
                "worker CPU",
                "broker CPU",
                "postgres CPU",
                "machine busy",
                "produce s",
            ),
            rows,
        )
    )
    print(
        f"\nThe workers share this machine's {os.cpu_count()} CPUs with the broker, PostgreSQL"
        " and this process: a second worker adds an event loop, not a core. Once the"
        " partitions were split and each worker had accounted one warm-up event per"
        " partition, the workers were frozen (SIGSTOP), the backlog produced (produce s),"
        " and the workers thawed together (SIGCONT): both drain a waiting backlog."
    )


def to_json(results: Results, args: argparse.Namespace) -> dict[str, Any]:
    def measured(m: Measured | None) -> dict[str, Any] | None:
        if m is None:
            return None
        return {
            "label": m.label,
            "events": m.events,
            "seconds": m.seconds,
            "events_per_s": m.rate,
            "cpu_percent": m.cpu,
        }

    return {
        "bench": "accounting_throughput",
        **run_info("bench.accounting_throughput"),
        "store": args.store,
        "partitions": args.partitions,
        "table_flush_seconds": args.table_flush_seconds,
        "batched_worker": BATCHED,
        "rows": [measured(r) for r in results.rows],
        "shapes": [
            {
                "events": s.events,
                "conversations": s.conversations,
                "floor": measured(s.floor),
                "floor_after": measured(s.floor_after),
                "floor_rate": s.floor_rate,
                "workers": [
                    {
                        "accounting_batch_max": w.batch_max,
                        **(measured(w.measured) or {}),
                        "ratio_to_floor": (
                            w.measured.rate / s.floor_rate if s.floor_rate else None
                        ),
                        "table_writes_per_event": w.writes_per_event,
                        "mean_batch_events": w.mean_batch,
                        "stored_in_postgres": w.stored,
                        "commit_audit": (
                            {
                                "samples": w.audit.samples,
                                "violations": w.audit.violations,
                                "committed_at_end": w.audit.last_committed,
                            }
                            if w.audit
                            else None
                        ),
                        "expected": w.expected,
                    }
                    for w in s.workers
                ],
            }
            for s in results.shapes
        ],
        "scale_out": [
            {
                "workers": s.workers,
                "accounting_batch_max": args.scale_out_batch if BATCHED else None,
                "partitions": s.partitions,
                "events_per_worker": s.per_worker_events,
                "produce_seconds": s.produce_seconds,
                **(measured(s.measured) or {}),
            }
            for s in results.scale
        ],
    }


def keep_logs(infra: Infra, into: Path) -> None:
    """Copy every worker's and floor's log out of the run's temporary directory."""
    for log in infra.tmp.glob("*/*.log"):
        target = into / log.parent.name / log.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, target)
    note(f"logs kept in {into}")


def interrupt_on_sigterm() -> None:
    """SIGTERM (``timeout``, a supervisor) unwinds like Ctrl-C, so the broker,
    PostgreSQL and workers this run started are stopped on the way out."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def run_info(module: str) -> dict[str, Any]:
    """What the printed header says, for a JSON file."""
    return {
        "command": shlex.join(["python", "-m", module, *sys.argv[1:]]),
        "cpus": os.cpu_count(),
        "code": git_revision(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.accounting_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--conversations", type=int, default=2_000)
    parser.add_argument(
        "--dense-conversations",
        type=int,
        default=200,
        help="a second run shape: --events over this many conversations (0: skip it)",
    )
    parser.add_argument(
        "--batch-max",
        type=int,
        nargs="+",
        default=[1, 10, 100, 500, 2000],
        help="[service].accounting_batch_max values, one worker run each",
    )
    parser.add_argument(
        "--table-flush-seconds",
        type=float,
        default=None,
        help="[service].table_flush_seconds (default: the service's)",
    )
    parser.add_argument(
        "--scale-out-batch",
        type=int,
        default=500,
        help="accounting_batch_max of the 1-vs-2-worker rows (0: skip them)",
    )
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--store", choices=["rocksdb://", "memory://"], default="rocksdb://")
    parser.add_argument("--pg-only", action="store_true", help="only the PostgreSQL baselines")
    parser.add_argument(
        "--linger-ms",
        type=float,
        default=0.0,
        help="producer linger for the Faust processes (the service leaves Faust's default, 0)",
    )
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=PARTS,
        default=list(PARTS),
        help="what to run (default: all): the single-component baselines, the worker sweep"
        " on the main shape, the dense shape's sweep, the 1-vs-2-worker scale-out",
    )
    parser.add_argument("--json", default=None, metavar="FILE", help="also write JSON here")
    parser.add_argument("--keep-logs", default=None, metavar="DIR", help="copy worker logs here")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2 000 events over 200 (and 20) conversations, batch_max 1 and 500",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the worker")
    args = parser.parse_args()
    interrupt_on_sigterm()
    if args.quick:  # smaller defaults; options given explicitly still win
        parser.set_defaults(
            events=2_000, conversations=200, dense_conversations=20, batch_max=[1, 500]
        )
        args = parser.parse_args()
    print_header("accounting throughput", "bench.accounting_throughput")
    with Infra(kafka=not args.pg_only, partitions=args.partitions) as infra:
        print(infra.describe())
        print(f"postgres: server {asyncio.run(infra.server_version())}")
        dense = f" (and over {args.dense_conversations})" if args.dense_conversations else ""
        print(
            f"workload: {args.events} events over {args.conversations} conversations{dense}, "
            f"{args.partitions} partitions, no compactions; worker store {args.store}, "
            f"Faust producer linger {args.linger_ms:g} ms, table_flush_seconds "
            f"{'default' if args.table_flush_seconds is None else args.table_flush_seconds}\n"
        )
        try:
            results = asyncio.run(run(args, infra))
        finally:
            if args.keep_logs:
                keep_logs(infra, Path(args.keep_logs))
    report(results.rows, args.store)
    if results.shapes:
        print()
        report_shapes(results.shapes)
    if results.scale:
        print()
        report_scale(results.scale)
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(results, args), indent=2) + "\n")
        note(f"wrote {args.json}")


if __name__ == "__main__":
    main()
