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
                    ``save_message``, plus token sum + message count for a
                    conversation's first event (``rebuilt_tally``);
* Faust floor       ``bench.faust_floor``: the same Faust app settings with
                    an agent that does nothing, then one that only writes
                    the table (changelog-backed; memory://, then ``--store``);
* worker            ``compactor worker`` in a subprocess, polled on
                    /metrics (compactor_events_in_total) every 50 ms.

Each Faust process is a subprocess with its own consumer group, timed from
its first event to its last: the floors by their own clock, the worker by
polling. ``--pg-only`` runs only the PostgreSQL
rows (no Kafka, no Faust).

    python -m bench.accounting_throughput [--events 20000] [--conversations 2000]
    python -m bench.accounting_throughput --quick
    python -m bench.accounting_throughput --pg-only
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
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
from core.storage.postgres import PostgresStore, configure_connection
from core.tokens import estimate_message_tokens
from streams.events import MessageEvent
from tests.support.worker import WorkerProcess

INSERT_SQL = """
INSERT INTO messages (id, conversation_id, role, content, tool_calls,
                      tool_call_id, created_at, token_estimate)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (id) DO NOTHING
RETURNING id
"""
COUNT_SQL = "SELECT count(*) FROM messages WHERE conversation_id = $1"


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
        meter.start()
        started = time.perf_counter()
        for event in events:
            await run.fetchval(INSERT_SQL, *insert_args(event))
        seconds = time.perf_counter() - started
        cpu = meter.stop()
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
ON CONFLICT (id) DO NOTHING
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
    """What the agent asks of PostgreSQL, through the real ``PostgresStore``:
    ``save_message``, and for a conversation's first event the two queries of
    ``rebuilt_tally`` (token sum, message count)."""
    store = await PostgresStore.connect(dsn, run_migrations=False)
    seen: set[str] = set()
    try:
        meter.start()
        started = time.perf_counter()
        for event in events:
            message = event.to_message()
            tokens = event.token_count
            await store.save_message(
                message, tokens if tokens is not None else estimate_message_tokens(message)
            )
            if event.conversation_id not in seen:
                seen.add(event.conversation_id)
                await store.conversation_token_total(event.conversation_id)
                await store.pool.fetchval(COUNT_SQL, event.conversation_id)
        seconds = time.perf_counter() - started
        cpu = meter.stop()
    finally:
        await store.close()
    return Measured("PostgresStore calls, as the agent makes them", len(events), seconds, cpu)


# --------------------------------------------------------------------------- Faust processes


def meter_for(infra: Infra, pid: int) -> CpuMeter:
    return CpuMeter({"reader": pid, "broker": infra.broker_pid, "postgres": infra.postgres_pid})


async def drain(
    infra: Infra,
    proc: WorkerProcess | FloorProcess,
    label: str,
    topic: str,
    args: argparse.Namespace,
    expected: int,
    count_of: Callable[[], Awaitable[float]],
) -> Measured:
    """Time a Faust process from its first event counted to its last (polled every 50 ms)."""
    await wait_assigned(proc, topic, args.partitions)
    note(f"{label}: ready; draining the backlog")
    deadline = time.monotonic() + args.timeout
    first: tuple[float, float] | None = None  # (time, count)
    meter = meter_for(infra, proc.pid)
    count = 0.0
    while True:
        if not proc.alive:
            raise RuntimeError(f"{label} exited; log:\n{proc.log_tail()}")
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
        raise RuntimeError(f"{label} drained the topic within one poll: use more --events")
    return Measured(label, int(count - first[1]), now - first[0], cpu)


async def faust_floor(
    infra: Infra, topic: str, args: argparse.Namespace, mode: str, store: str, expected: int
) -> Measured:
    proc = FloorProcess(
        infra,
        f"floor-{mode}-{store[:-3]}",
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
        polled = await drain(infra, proc, label, topic, args, expected, count_of)
        # The floor timed itself (first event to last, in its own process): exact,
        # where polling is coarse for a reader this fast.
        own = await proc.get_json("/count")
    return Measured(label, own["count"] - 1, own["last_at"] - own["first_at"], polled.cpu)


async def worker_drain(
    infra: Infra, prefix: str, args: argparse.Namespace, expected: int
) -> Measured:
    config = worker_config(topic_prefix=prefix, partitions=args.partitions, store=args.store)
    # Faust reads PRODUCER_LINGER (seconds) from the environment; unset, it is 0.
    env = {"PRODUCER_LINGER": str(args.linger_ms / 1000)} if args.linger_ms else None
    worker = new_worker(infra, "worker", await infra.new_database(), config, env)

    async def count_of() -> float:
        metrics = await worker_metrics(worker)
        duplicates = metrics.get('compactor_events_in_total{outcome="duplicate"}', 0.0)
        if duplicates:
            raise RuntimeError(f"{duplicates:.0f} events were accounted as duplicates")
        return metrics.get("compactor_events_in_total", 0.0)

    label = f"worker accounting agent ({args.store})"
    with running(worker):
        return await drain(infra, worker, label, f"{prefix}messages", args, expected, count_of)


# --------------------------------------------------------------------------- main


async def run(args: argparse.Namespace, infra: Infra) -> list[Measured]:
    run_id = f"r{int(time.time()) % 100000}"
    events = make_events(args.events, args.conversations, run_id)
    results: list[Measured] = []
    if not args.pg_only:
        assert infra.bootstrap is not None
        prefix = unique_prefix("acct")
        names = await create_topics(infra.bootstrap, prefix, args.partitions)
        note(f"producing {len(events)} events to {names.messages}")
        count, seconds = await produce(infra.bootstrap, names.messages, events)
        note(f"produced {count} events in {seconds:.1f}s ({count / seconds:.0f}/s)")
        for decode in (False, True):
            results.append(
                await kafka_read(
                    infra.bootstrap,
                    names.messages,
                    args.partitions,
                    len(events),
                    meter_for(infra, os.getpid()),
                    decode=decode,
                )
            )
    note("PostgreSQL baselines")
    for pooled in (False, True):
        meter = meter_for(infra, os.getpid())
        dsn = await infra.new_database()
        results.append(await pg_insert_loop(dsn, events, meter, pooled=pooled))
    meter = meter_for(infra, os.getpid())
    results.append(await pg_batch_insert(await infra.new_database(), events, meter, 100))
    meter = meter_for(infra, os.getpid())
    results.append(await pg_store_calls(await infra.new_database(), events, meter))
    if not args.pg_only:
        results.append(
            await faust_floor(infra, names.messages, args, "noop", "memory://", len(events))
        )
        for store in dict.fromkeys(["memory://", args.store]):
            results.append(
                await faust_floor(infra, names.messages, args, "table", store, len(events))
            )
        results.append(await worker_drain(infra, prefix, args, len(events)))
    return results


def report(results: list[Measured], store: str) -> None:
    baseline = results[0]

    def pct(r: Measured, key: str) -> str:
        return f"{r.cpu[key]:.0f}%" if key in r.cpu else "-"

    rows = [
        (
            r.label,
            r.events,
            f"{r.seconds:.2f}",
            f"{r.rate:,.0f}",
            f"{r.micros:.0f}",
            f"{r.rate / baseline.rate:.3f}",
            pct(r, "reader"),
            pct(r, "broker"),
            pct(r, "postgres"),
            pct(r, "machine"),
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
    if worker and all(parts.values()):
        known = sum(r.micros for r in parts.values() if r)
        shares = " + ".join(f"{name} {r.micros:.0f}" for name, r in parts.items() if r)
        print(
            f"\nper event in the worker: {worker.micros:.0f} µs; its parts measured alone: "
            f"{shares} = {known:.0f} µs; not explained by them: {worker.micros - known:.0f} µs"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.accounting_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--conversations", type=int, default=2_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--store", choices=["rocksdb://", "memory://"], default="rocksdb://")
    parser.add_argument("--pg-only", action="store_true", help="only the PostgreSQL baselines")
    parser.add_argument(
        "--linger-ms",
        type=float,
        default=0.0,
        help="producer linger for the Faust processes (the service leaves Faust's default, 0)",
    )
    parser.add_argument("--quick", action="store_true", help="2 000 events, 200 conversations")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the worker")
    args = parser.parse_args()
    if args.quick:  # smaller defaults; options given explicitly still win
        parser.set_defaults(events=2_000, conversations=200)
        args = parser.parse_args()
    print_header("accounting throughput", "bench.accounting_throughput")
    with Infra(kafka=not args.pg_only, partitions=args.partitions) as infra:
        print(infra.describe())
        print(f"postgres: server {asyncio.run(infra.server_version())}")
        print(
            f"workload: {args.events} events over {args.conversations} conversations, "
            f"{args.partitions} partitions, no compactions; worker store {args.store}, "
            f"Faust producer linger {args.linger_ms:g} ms\n"
        )
        results = asyncio.run(run(args, infra))
    report(results, args.store)


if __name__ == "__main__":
    main()
