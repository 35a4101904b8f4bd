"""Memory of a worker holding many conversations in its token table.

For each table store (``memory://``, ``rocksdb://``): start a worker, account
a small warm-up (so pools, codecs and caches exist), read its VmRSS from
/proc/<pid>/status, then produce N message events with N distinct
conversation ids (budget high: no compactions), wait until all are
accounted, let it settle, and read VmRSS again. The growth divided by N is
the cost of one conversation in the worker (the table entry plus whatever
else grows per conversation; PostgreSQL rows are created too, in another
process).

Baseline, same run: the bytes per entry of a plain Python dict holding the
same tally dicts (``ConversationTally.model_dump()``), measured with
tracemalloc in this process: what any in-memory table costs at least in CPython.

Afterwards, /healthz is polled every 100 ms for ``--idle`` seconds, while
the reconciliation timer runs every reconcile_interval_seconds: the slowest
answer shows how long anything held the event loop. (Older workers walked the
whole table on every pass; the worker now keeps an index of the entries a
pass can act on, rebuilt by one yielding scan after an assignment.
``bench.reconcile_scale`` measures the passes themselves at up to a million
entries.)

    python -m bench.table_memory [--conversations 100000] [--stores memory:// rocksdb://]
    python -m bench.table_memory --quick
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
import tracemalloc
from dataclasses import dataclass

import aiohttp

from bench.harness import (
    Infra,
    create_topics,
    message_event,
    new_worker,
    note,
    print_header,
    proc_status,
    produce,
    running,
    table,
    unique_prefix,
    wait_assigned,
    worker_config,
    worker_metrics,
)
from core.domain.tally import ConversationTally
from core.settings import ServiceSettings
from tests.support.worker import WorkerProcess

MIB = 1024 * 1024
DEFAULT_INTERVAL = ServiceSettings().reconcile_interval_seconds


@dataclass
class Result:
    store: str
    conversations: int
    rss_before_kib: int
    rss_after_kib: int
    hwm_kib: int
    accounted_seconds: float
    slowest_healthz: float | None = None
    idle_seconds: float = 0.0

    @property
    def growth_bytes(self) -> int:
        return (self.rss_after_kib - self.rss_before_kib) * 1024

    @property
    def per_conversation(self) -> float:
        return self.growth_bytes / self.conversations


def python_dict_baseline(n: int) -> float:
    """Bytes per entry of {conversation id: tally dict} in this process."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    entries = {
        f"mem-c{i:07d}": ConversationTally(
            conversation_id=f"mem-c{i:07d}", token_total=20, message_count=1
        ).model_dump()
        for i in range(n)
    }
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(entries) == n
    return (after - before) / n


async def wait_accounted(worker: WorkerProcess, expected: float, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        if not worker.alive:
            raise RuntimeError(f"worker exited; log:\n{worker.log_tail()}")
        count = (await worker_metrics(worker)).get("compactor_events_in_total", 0.0)
        if count >= expected:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {count:.0f} of {expected:.0f} events accounted")
        await asyncio.sleep(0.5)


async def slowest_healthz(worker: WorkerProcess, seconds: float) -> float:
    """The slowest /healthz answer while polling every 100 ms for ``seconds``."""
    worst = 0.0
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            async with session.get(f"{worker.url}/healthz") as response:
                await response.read()
            worst = max(worst, time.perf_counter() - started)
            await asyncio.sleep(0.1)
    return worst


async def measure(infra: Infra, store: str, args: argparse.Namespace) -> Result:
    assert infra.bootstrap is not None
    prefix = unique_prefix("mem")
    names = await create_topics(infra.bootstrap, prefix, args.partitions)
    config = worker_config(topic_prefix=prefix, partitions=args.partitions, store=store)
    if args.reconcile_interval is not None:
        config["service"]["reconcile_interval_seconds"] = args.reconcile_interval
    worker = new_worker(infra, f"worker-{store[:-3]}", await infra.new_database(), config)
    tag = f"{store[:-3]}{int(time.time()) % 100000}"
    with running(worker):
        await wait_assigned(worker, names.messages, args.partitions)
        warm = [message_event(f"{tag}-warm-{i:05d}", 0, token_count=20) for i in range(args.warmup)]
        await produce(infra.bootstrap, names.messages, warm)
        await wait_accounted(worker, len(warm), args.timeout)
        await asyncio.sleep(args.settle)
        before = proc_status(worker.pid)["VmRSS"]
        note(
            f"{store}: VmRSS {before / 1024:.0f} MiB after warm-up; producing {args.conversations}"
        )
        events = (
            message_event(f"{tag}-c{i:07d}", 0, token_count=20) for i in range(args.conversations)
        )
        started = time.perf_counter()
        await produce(infra.bootstrap, names.messages, events)
        await wait_accounted(worker, len(warm) + args.conversations, args.timeout)
        accounted = time.perf_counter() - started
        await asyncio.sleep(args.settle)
        status = proc_status(worker.pid)
        note(f"{store}: VmRSS {status['VmRSS'] / 1024:.0f} MiB; idle probe {args.idle:.0f}s")
        sample = f"{tag}-c{args.conversations - 1:07d}"
        entry = await worker.get_json(f"/conversations/{sample}")
        if entry.get("message_count") != 1:
            raise RuntimeError(f"unexpected table entry for {sample}: {entry}")
        slowest = await slowest_healthz(worker, args.idle) if args.idle > 0 else None
    return Result(
        store,
        args.conversations,
        before,
        status["VmRSS"],
        status["VmHWM"],
        accounted,
        slowest,
        args.idle,
    )


async def run(args: argparse.Namespace, infra: Infra) -> list[Result]:
    return [await measure(infra, store, args) for store in args.stores]


def report(results: list[Result], baseline: float) -> None:
    rows = [
        (
            "Python dict of tally dicts (tracemalloc, this process)",
            results[0].conversations if results else "-",
            "-",
            "-",
            "-",
            "-",
            f"{baseline:.0f}",
            "1.0",
            "-",
            "-",
        )
    ]
    for r in results:
        rows.append(
            (
                f"worker, store {r.store}",
                r.conversations,
                f"{r.rss_before_kib / 1024:.0f}",
                f"{r.rss_after_kib / 1024:.0f}",
                f"{r.hwm_kib / 1024:.0f}",
                f"{r.growth_bytes / MIB:.1f}",
                f"{r.per_conversation:.0f}",
                f"{r.per_conversation / baseline:.1f}",
                f"{r.conversations / r.accounted_seconds:.0f}",
                "-" if r.slowest_healthz is None else f"{r.slowest_healthz * 1000:.0f}",
            )
        )
    print(
        table(
            (
                "holder",
                "conversations",
                "RSS before MiB",
                "RSS after MiB",
                "VmHWM MiB",
                "growth MiB",
                "bytes/conversation",
                "÷ dict baseline",
                "accounted/s",
                "slowest /healthz ms",
            ),
            rows,
        )
    )
    if results and results[0].slowest_healthz is not None:
        print(
            f"\nslowest /healthz: worst answer while polling every 100 ms for "
            f"{results[0].idle_seconds:.0f} s after the load, with the table full "
            "(the reconciliation timer runs every reconcile_interval_seconds)."
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.table_memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--conversations", type=int, default=100_000)
    parser.add_argument("--stores", nargs="+", default=["memory://", "rocksdb://"])
    parser.add_argument("--warmup", type=int, default=1_000, help="conversations before 'before'")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before reading RSS")
    parser.add_argument("--idle", type=float, default=35.0, help="seconds of /healthz probing")
    parser.add_argument(
        "--reconcile-interval",
        type=float,
        default=None,
        help="[service].reconcile_interval_seconds (default: the service's)",
    )
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument(
        "--quick", action="store_true", help="5 000 conversations, memory:// only, no idle probe"
    )
    args = parser.parse_args()
    if args.quick:  # smaller defaults; options given explicitly still win
        parser.set_defaults(
            conversations=5_000, stores=["memory://"], warmup=200, settle=2.0, idle=0.0
        )
        args = parser.parse_args()
    print_header("table memory", "bench.table_memory")
    baseline = python_dict_baseline(args.conversations)
    with Infra(partitions=args.partitions) as infra:
        print(infra.describe())
        print(
            f"workload: {args.warmup} warm-up + {args.conversations} conversations of one "
            f"message each, budget high (no compactions); reconcile interval "
            f"{args.reconcile_interval or DEFAULT_INTERVAL:g} s\n"
        )
        results = asyncio.run(run(args, infra))
    report(results, baseline)


if __name__ == "__main__":
    main()
