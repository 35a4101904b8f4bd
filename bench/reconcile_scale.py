"""Reconciliation with a large token table (P5): is the event loop ever held,
and does a pass cost what it can act on or what the table holds?

For each table size and each actionable count, a fresh worker (RocksDB
store) is given a table it has never seen: before it starts, the benchmark
writes the table's changelog topic itself (``<app_id>-conversations-changelog``,
compacted, as many partitions as the messages topic), one record per
conversation, exactly as the worker would have: the key is the conversation
id encoded with Faust's ``json`` codec (the table's ``key_type=str`` gives
it), the value the tally dict (``ConversationTally.model_dump()``) in JSON,
and the partition is the one the conversation's messages go to (murmur2 of
the raw id, as every Kafka client partitions), which is where the accounting
agent writes it. The worker restores the table from the changelog on
start-up; nothing goes through PostgreSQL.

The entries:

* ``size - actionable - pending`` ordinary ones (20 tokens, nothing outstanding);
* ``actionable`` that the first pass must act on: half over the budget with
  nothing outstanding, half with a command outstanding for longer than
  ``command_timeout_seconds``. Each gets one reconcile request; the agent then
  takes the store's counts (PostgreSQL has no rows for them: 0 tokens), so
  the first half drops out, and the second has its command re-sent, which the
  processor answers ``under_budget``: after the first pass they are gone from
  the set the reconciler can act on;
* ``pending`` (default: as many as actionable) with a command outstanding
  since the benchmark started, not due within the run
  (``command_timeout_seconds`` is 3 600 here): candidates in every pass, never
  acted on.

Measured: the changelog production; the restore (the worker is assigned its
partitions → a sentinel message event produced then is accounted, which
Faust only lets happen once the table is recovered); VmRSS after it and
VmHWM at the end; then, for ``--ticks`` reconcile intervals
(``--interval``, [service].reconcile_interval_seconds), /healthz every 100 ms
(its slowest answer: how long the event loop was held) and /metrics every
200 ms, until ``--ticks`` passes were seen: each pass's wall time from ``compactor_reconcile_tick_seconds``
(Δsum ÷ Δcount) and ``compactor_reconcile_candidates`` just before it. The
same actionable count at two table sizes tells whether a pass's cost follows
the table or the candidates.

    python -m bench.reconcile_scale [--sizes 100000 1000000] [--actionable 1000 10000]
    python -m bench.reconcile_scale --quick
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.accounting_throughput import interrupt_on_sigterm, run_info
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
from core.domain.budget import BudgetConfig
from core.domain.tally import ConversationTally, compaction_id_for
from tests.support.worker import WorkerProcess

BUDGET = (0.8, 200_000)  # context_budget, model_max_tokens (harness.worker_config's)
COMMAND_TIMEOUT = 3600.0
TICK_SUM = "compactor_reconcile_tick_seconds_sum"
TICK_COUNT = "compactor_reconcile_tick_seconds_count"
CANDIDATES = "compactor_reconcile_candidates"


# --------------------------------------------------------------------------- the changelog


def table_entries(
    tag: str, size: int, actionable: int, pending: int, now: float
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(conversation id, tally dict) for every entry; the special ones first."""
    budget_tokens = BudgetConfig(context_budget=BUDGET[0], model_max_tokens=BUDGET[1]).budget_tokens
    over = actionable // 2
    for i in range(size):
        cid = f"{tag}-c{i:07d}"
        if i < over:  # over the budget, nothing outstanding: due now
            tally = ConversationTally(
                conversation_id=cid, token_total=10 * budget_tokens, message_count=50
            )
        elif i < actionable:  # a command outstanding for longer than the timeout
            tally = ConversationTally(
                conversation_id=cid,
                token_total=10 * budget_tokens,
                message_count=50,
                outstanding=compaction_id_for(cid, 0),
                outstanding_since=now - 2 * COMMAND_TIMEOUT,
            )
        elif i < actionable + pending:  # a command outstanding, not due in this run
            tally = ConversationTally(
                conversation_id=cid,
                token_total=10 * budget_tokens,
                message_count=50,
                outstanding=compaction_id_for(cid, 0),
                outstanding_since=now,
            )
        else:
            tally = ConversationTally(conversation_id=cid, token_total=20, message_count=1)
        yield cid, tally.model_dump()


async def write_changelog(
    bootstrap: str, topic: str, partitions: int, entries: Iterator[tuple[str, dict[str, Any]]]
) -> tuple[int, float]:
    """Create ``topic`` (compacted) and write the entries as Faust's table would.

    Records go out in producer batches built directly (``create_batch``), one
    partition at a time per batch, which is several times faster than one
    ``send`` per record."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.partitioner import DefaultPartitioner
    from faust.serializers import codecs

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(topic, partitions, 1, topic_configs={"cleanup.policy": "compact"})]
        )
    finally:
        await admin.close()
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=50,
        max_batch_size=1024 * 1024,
        max_request_size=4 * 1024 * 1024,
    )
    await producer.start()
    partitioner = DefaultPartitioner()
    every = list(range(partitions))
    batches = [producer.create_batch() for _ in every]
    pending: list[asyncio.Future[Any]] = []
    count = 0
    started = time.perf_counter()

    async def flush(p: int) -> None:
        batch = batches[p]
        batch.close()
        pending.append(await producer.send_batch(batch, topic, partition=p))
        batches[p] = producer.create_batch()
        if len(pending) >= 64:
            await asyncio.gather(*pending)
            pending.clear()

    try:
        for cid, value in entries:
            p = partitioner(cid.encode(), every, every)
            key = codecs.dumps("json", cid)  # what the table's key_type=str encodes to
            raw = codecs.dumps("json", value)
            if batches[p].append(key=key, value=raw, timestamp=None) is None:
                await flush(p)
                if batches[p].append(key=key, value=raw, timestamp=None) is None:
                    raise RuntimeError("a changelog record larger than a producer batch")
            count += 1
            if count % 200_000 == 0:
                note(f"changelog: {count} records")
        for p in every:
            if batches[p].record_count():
                await flush(p)
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return count, time.perf_counter() - started


# --------------------------------------------------------------------------- probes


@dataclass
class Tick:
    at: float  # seconds after the restore completed (when the pass was seen)
    seconds: float  # the pass's wall time (Δsum ÷ Δcount)
    passes: int
    candidates_before: float | None  # the gauge before the pass (set by the previous one)
    candidates_after: float | None  # the gauge the pass itself set


@dataclass
class Probe:
    slowest_healthz: float = 0.0
    slowest_at: float = 0.0  # when that request was sent, seconds after the probe's origin
    healthz_answers: int = 0
    healthz_failures: int = 0
    ticks: list[Tick] = field(default_factory=list)
    candidates_last: float | None = None
    has_tick_metric: bool = False


async def poll_healthz(
    worker: WorkerProcess, probe: Probe, stop: asyncio.Event, origin: float
) -> None:
    """/healthz every 100 ms; the slowest answer is how long the loop was held."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                async with session.get(f"{worker.url}/healthz") as response:
                    await response.read()
                probe.healthz_answers += 1
            except (aiohttp.ClientError, TimeoutError):
                probe.healthz_failures += 1
            took = time.perf_counter() - started
            if took > probe.slowest_healthz:
                probe.slowest_healthz, probe.slowest_at = took, started - origin
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)


async def poll_ticks(
    worker: WorkerProcess, probe: Probe, stop: asyncio.Event, origin: float
) -> None:
    """/metrics every 200 ms: a pass is seen when the histogram's count moves."""
    last_sum = last_count = None
    candidates: float | None = None
    while not stop.is_set():
        try:
            metrics = await worker_metrics(worker)
        except (aiohttp.ClientError, TimeoutError, AssertionError):
            metrics = {}
        total, count = metrics.get(TICK_SUM), metrics.get(TICK_COUNT)
        if total is not None and count is not None:
            probe.has_tick_metric = True
            after = metrics.get(CANDIDATES)
            if last_count is not None and last_sum is not None and count > last_count:
                probe.ticks.append(
                    Tick(
                        time.perf_counter() - origin,
                        (total - last_sum) / (count - last_count),
                        int(count - last_count),
                        candidates,
                        after,
                    )
                )
            last_sum, last_count = total, count
        candidates = metrics.get(CANDIDATES, candidates)
        probe.candidates_last = candidates
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


async def wait_counted(worker: WorkerProcess, expected: float, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        if not worker.alive:
            raise RuntimeError(f"{worker.name} exited; log:\n{worker.log_tail()}")
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, AssertionError):
            metrics = await worker_metrics(worker)
            if metrics.get("compactor_events_in_total", 0.0) >= expected:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{worker.name}: the sentinel was not accounted in {within:.0f}s")
        await asyncio.sleep(0.1)


# --------------------------------------------------------------------------- one run


@dataclass
class Result:
    size: int
    actionable: int
    pending: int
    produce_seconds: float
    start_to_assigned: float
    restore_seconds: float
    rss_after_restore_kib: int
    rss_end_kib: int
    hwm_kib: int
    restore_probe: Probe
    window_probe: Probe
    window_seconds: float
    sample_ok: bool
    healed: str = "-"

    def first_tick(self) -> Tick | None:
        return self.window_probe.ticks[0] if self.window_probe.ticks else None

    def steady_ticks(self) -> list[Tick]:
        return self.window_probe.ticks[1:]

    def first_seconds(self) -> float | None:
        first = self.first_tick()
        return first.seconds if first else None

    def later_seconds(self) -> float | None:
        later = self.steady_ticks()
        return sum(t.seconds for t in later) / len(later) if later else None


async def measure(infra: Infra, args: argparse.Namespace, size: int, actionable: int) -> Result:
    assert infra.bootstrap is not None
    pending = args.pending if args.pending is not None else actionable
    if actionable + pending > size:
        raise SystemExit(f"--actionable {actionable} + pending {pending} > table size {size}")
    prefix = unique_prefix("rec")
    names = await create_topics(infra.bootstrap, prefix, args.partitions)
    config = worker_config(
        topic_prefix=prefix, partitions=args.partitions, store="rocksdb://", budget=BUDGET
    )
    service = config["service"]
    service["reconcile_interval_seconds"] = args.interval
    service["command_timeout_seconds"] = COMMAND_TIMEOUT
    app_id = service["app_id"]
    tag = f"rs{int(time.time()) % 100000}"
    changelog = f"{app_id}-conversations-changelog"
    note(f"{size} entries ({actionable} actionable, {pending} pending) → {changelog}")
    count, produce_seconds = await write_changelog(
        infra.bootstrap,
        changelog,
        args.partitions,
        table_entries(tag, size, actionable, pending, time.time()),
    )
    note(f"changelog written: {count} records in {produce_seconds:.1f}s")
    worker = new_worker(infra, f"rec-{size}-{actionable}", await infra.new_database(), config)
    restore_probe, window_probe = Probe(), Probe()
    with running(worker):
        started = time.perf_counter()
        await wait_assigned(worker, names.messages, args.partitions, within=args.timeout)
        assigned = time.perf_counter()
        note(f"assigned after {assigned - started:.1f}s; restoring")
        stop = asyncio.Event()
        healthz = asyncio.create_task(poll_healthz(worker, restore_probe, stop, assigned))
        sentinel = message_event(f"{tag}-sentinel", 0, token_count=20)
        await produce(infra.bootstrap, names.messages, [sentinel])
        await wait_counted(worker, 1, args.timeout)
        restored = time.perf_counter()
        stop.set()
        await healthz
        rss_after_restore = proc_status(worker.pid)["VmRSS"]
        note(
            f"restored in {restored - assigned:.1f}s; VmRSS {rss_after_restore / 1024:.0f} MiB; "
            f"probing {args.ticks} reconcile intervals"
        )
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(poll_healthz(worker, window_probe, stop, restored)),
            asyncio.create_task(poll_ticks(worker, window_probe, stop, restored)),
        ]
        # At least --ticks intervals, and until --ticks passes were seen (a first
        # pass that sends thousands of requests can outlast its interval).
        window_start = time.perf_counter()
        deadline = window_start + args.timeout
        while True:
            await asyncio.sleep(0.5)
            now = time.perf_counter()
            enough = now - window_start >= (args.ticks + 0.5) * args.interval
            seen = len(window_probe.ticks) >= args.ticks or not window_probe.has_tick_metric
            if (enough and seen) or now > deadline or not worker.alive:
                break
        window = time.perf_counter() - window_start
        stop.set()
        await asyncio.gather(*tasks)
        status = proc_status(worker.pid)
        sample_ok = await check_sample(worker, f"{tag}-c{size - 1:07d}")
        healed = [
            await acted_on(worker, f"{tag}-c{i:07d}")
            for i in sorted({0, actionable // 2 - 1, actionable // 2, actionable - 1})
            if 0 <= i < actionable
        ]
        if not worker.alive:
            raise RuntimeError(f"{worker.name} exited; log:\n{worker.log_tail()}")
    return Result(
        size=size,
        actionable=actionable,
        pending=pending,
        produce_seconds=produce_seconds,
        start_to_assigned=assigned - started,
        restore_seconds=restored - assigned,
        rss_after_restore_kib=rss_after_restore,
        rss_end_kib=status["VmRSS"],
        hwm_kib=status["VmHWM"],
        restore_probe=restore_probe,
        window_probe=window_probe,
        window_seconds=window,
        sample_ok=sample_ok,
        healed=f"{sum(healed)}/{len(healed)}",
    )


async def check_sample(worker: WorkerProcess, conversation_id: str) -> bool:
    """The last entry written to the changelog is in the worker's table, as written."""
    status, body = await worker.get(f"/conversations/{conversation_id}")
    ok = status == 200 and isinstance(body, dict) and body.get("message_count") == 1
    if not ok:
        note(f"restored entry {conversation_id}: {status} {str(body)[:300]}")
    return ok


async def acted_on(worker: WorkerProcess, conversation_id: str) -> bool:
    """An actionable entry the worker has dealt with: resynced from the store (no
    rows there: 0 tokens) and nothing outstanding any more."""
    status, body = await worker.get(f"/conversations/{conversation_id}")
    return (
        status == 200
        and isinstance(body, dict)
        and body.get("token_total") == 0
        and body.get("compaction_outstanding") is None
    )


async def run(args: argparse.Namespace, infra: Infra) -> list[Result]:
    results = []
    for size in args.sizes:
        for actionable in args.actionable:
            results.append(await measure(infra, args, size, actionable))
    return results


# --------------------------------------------------------------------------- report


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def report(results: list[Result]) -> None:
    rows = []
    for r in results:
        first = r.first_tick()
        steady = r.steady_ticks()
        steady_mean = r.later_seconds()
        steady_cand = steady[-1].candidates_before if steady else None
        rows.append(
            (
                r.size,
                r.actionable,
                r.pending,
                f"{r.produce_seconds:.1f}",
                f"{r.restore_seconds:.1f}",
                f"{r.size / r.restore_seconds:,.0f}" if r.restore_seconds else "-",
                f"{r.rss_after_restore_kib / 1024:.0f}",
                f"{r.hwm_kib / 1024:.0f}",
                ms(r.restore_probe.slowest_healthz),
                ms(r.window_probe.slowest_healthz),
                f"{r.window_seconds:.0f}",
                len(r.window_probe.ticks),
                "-" if first is None else f"{first.candidates_after or 0:.0f}",
                ms(first.seconds if first else None),
                "-" if steady_cand is None else f"{steady_cand:.0f}",
                ms(steady_mean),
                "yes" if r.sample_ok else "NO",
                r.healed,
            )
        )
    print(
        table(
            (
                "table entries",
                "actionable",
                "pending",
                "changelog s",
                "restore s",
                "restored/s",
                "RSS MiB",
                "VmHWM MiB",
                "slowest /healthz restoring ms",
                "slowest /healthz after ms",
                "probed s",
                "passes",
                "1st pass: candidates at its end",
                "1st pass ms",
                "later: candidates",
                "later pass mean ms",
                "entry restored",
                "actionable healed",
            ),
            rows,
        )
    )
    print(
        "\nrestore: the worker assigned its partitions → a sentinel event produced then is"
        " accounted (Faust holds the agents until the table is recovered). RSS after the"
        " restore; VmHWM at the end. slowest /healthz after: polling every 100 ms for the"
        " whole window after the restore (reconcile passes, and the agent handling the"
        " requests the first pass sent). A pass's time is compactor_reconcile_tick_seconds"
        " (Δsum ÷ Δcount between two /metrics polls 200 ms apart); candidates:"
        " compactor_reconcile_candidates read before it. entry restored: the last entry"
        " written to the changelog reads back through /conversations/{id}; actionable"
        " healed: of up to 4 sampled actionable entries, those resynced to the store's 0"
        " tokens with nothing outstanding at the end (the first pass reached them)."
    )
    by_actionable: dict[int, list[Result]] = {}
    for r in results:
        by_actionable.setdefault(r.actionable, []).append(r)
    lines = []
    for actionable, group in by_actionable.items():
        group = sorted(group, key=lambda r: r.size)
        small, large = group[0], group[-1]
        if small.size == large.size:
            continue
        for what in ("1st pass (index rebuilt: a table scan)", "later passes"):
            pick = Result.first_seconds if what.startswith("1st") else Result.later_seconds
            a, b = pick(small), pick(large)
            if a and b:
                lines.append(
                    f"{actionable} actionable, {what}: {b * 1000:.1f} ms at {large.size} entries"
                    f" vs {a * 1000:.1f} ms at {small.size} = {b / a:.2f}× for"
                    f" {large.size / small.size:.0f}× the table"
                )
    if lines:
        print(
            "\nproportionality (1.0×: the pass follows the candidates; the table ratio: the"
            " table):\n  " + "\n  ".join(lines)
        )
    if any(not r.window_probe.ticks for r in results):
        print(
            "\nno pass seen in some runs: this worker has no compactor_reconcile_tick_seconds"
            " (or no pass ran in the window); the /healthz column still holds."
        )
    print(
        "\npasses (seen this long after the restore: wall time, candidates before → after;"
        " the first one after the restore also rebuilds the candidate index, scanning the"
        " whole table once):"
    )
    for r in results:
        detail = ", ".join(
            f"{t.at:.1f}s: {t.seconds * 1000:.1f} ms, {t.candidates_before or 0:.0f}"
            f" → {t.candidates_after or 0:.0f}" + (f" ×{t.passes}" if t.passes > 1 else "")
            for t in r.window_probe.ticks
        )
        print(
            f"  {r.size} / {r.actionable}: {detail or '-'}; slowest /healthz"
            f" {r.window_probe.slowest_healthz * 1000:.0f} ms, asked"
            f" {r.window_probe.slowest_at:.1f}s after the restore"
        )


def to_json(results: list[Result], args: argparse.Namespace) -> dict[str, Any]:
    return {
        "bench": "reconcile_scale",
        **run_info("bench.reconcile_scale"),
        "interval_seconds": args.interval,
        "command_timeout_seconds": COMMAND_TIMEOUT,
        "runs": [
            {
                "table_entries": r.size,
                "actionable": r.actionable,
                "pending": r.pending,
                "changelog_seconds": r.produce_seconds,
                "start_to_assigned_seconds": r.start_to_assigned,
                "restore_seconds": r.restore_seconds,
                "rss_after_restore_mib": r.rss_after_restore_kib / 1024,
                "rss_end_mib": r.rss_end_kib / 1024,
                "vmhwm_mib": r.hwm_kib / 1024,
                "slowest_healthz_restoring_ms": r.restore_probe.slowest_healthz * 1000,
                "slowest_healthz_after_ms": r.window_probe.slowest_healthz * 1000,
                "slowest_healthz_after_asked_at_s": r.window_probe.slowest_at,
                "healthz_failures": r.window_probe.healthz_failures,
                "window_seconds": r.window_seconds,
                "passes": [
                    {
                        "after_restore_s": t.at,
                        "seconds": t.seconds,
                        "passes": t.passes,
                        "candidates_before": t.candidates_before,
                        "candidates_after": t.candidates_after,
                    }
                    for t in r.window_probe.ticks
                ],
                "entry_restored": r.sample_ok,
                "actionable_healed_sample": r.healed,
            }
            for r in results
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reconcile_scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--actionable", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument(
        "--pending",
        type=int,
        default=None,
        help="entries with a command not yet due (default: = actionable)",
    )
    parser.add_argument(
        "--interval", type=float, default=5.0, help="[service].reconcile_interval_seconds"
    )
    parser.add_argument("--ticks", type=int, default=3, help="reconcile intervals to probe")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--json", default=None, metavar="FILE", help="also write JSON here")
    parser.add_argument(
        "--quick", action="store_true", help="5 000 and 20 000 entries, 100 actionable, 3 s"
    )
    args = parser.parse_args()
    interrupt_on_sigterm()
    if args.quick:  # smaller defaults; options given explicitly still win
        parser.set_defaults(sizes=[5_000, 20_000], actionable=[100], interval=3.0)
        args = parser.parse_args()
    print_header("reconciliation at scale", "bench.reconcile_scale")
    with Infra(partitions=args.partitions) as infra:
        print(infra.describe())
        print(
            f"workload: table sizes {args.sizes}, actionable {args.actionable}, pending "
            f"{'= actionable' if args.pending is None else args.pending}; store rocksdb://, "
            f"reconcile_interval_seconds {args.interval:g}, command_timeout_seconds "
            f"{COMMAND_TIMEOUT:g}, {args.ticks} intervals probed\n"
        )
        results = asyncio.run(run(args, infra))
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(results, args), indent=2) + "\n")
        note(f"wrote {args.json}")


if __name__ == "__main__":
    main()
