"""A burst of messages against one worker with a slow LLM: how far over budget
do conversations get, and for how long (P4; the soft trigger ``compact_at``).

For every ``--budget-tokens``, every ``--concurrency`` (the worker's
max_concurrent_compactions; 64 ships) and every ``--compact-at`` value
(``none`` = trigger at the budget) a fresh worker
is started against the LLM test server (``tests.support.llm_server``, every
reply after ``--latency-ms``), with a fresh topic set and database. Then:

1. prefill: with ``--prefill staggered`` (default) conversation k of N gets
   ``k/N`` of the messages that fit under the target (0.8 × budget), so the
   conversations are at different points of their life when the burst starts
   and do not all cross the budget at the same message; ``none`` starts them
   empty (every conversation crosses together: the worst case). Accounted
   before the burst; nothing is due yet.
2. the burst: ``--events`` message events over ``--conversations``
   conversations, round-robin, produced as fast as the producer goes.
3. until settled: every event accounted, no compaction in flight, and every
   conversation at or under the trigger for 1.5 s (or ``--timeout``).

What is measured, per run:

* at each compaction (the processor, when it loads the history): the
  conversation's **stored** history tokens ÷ budget, from the worker's
  ``compactor_history_budget_ratio`` histogram and its ``_max`` gauge. Stored
  means every row the conversation has at that moment, including messages
  that arrived after the command's cut (``up_to_seq``), which this
  compaction will not touch;
* the same from the clip-archive events' ``tokens_before`` ÷ budget: what the
  compaction loaded (up to its cut), a cross-check;
* **time over budget**: every ``--sample-ms`` (50) this process sums
  ``token_estimate`` per conversation in PostgreSQL; a conversation over the
  budget in one sample counts as over until the next. Summed over
  conversations from the start of the burst to the end of the run, and as a
  share of all conversation-seconds in that window. ``reader saw over`` is
  the share of (sample, conversation) pairs over budget: what a reader
  polling at random moments would see;
* the accounting rate during the burst, compactions, LLM calls, and CPU
  (worker, broker, PostgreSQL, and how busy the whole machine was).

    python -m bench.burst [--events 10000] [--conversations 100] [--latency-ms 500]
                          [--budget-tokens 8000] [--concurrency 4 64] [--compact-at none 0.85]
    python -m bench.burst --rate 200      # paced traffic instead of a burst
    python -m bench.burst --quick
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.compaction_latency import CountingLLMServer, MetricsPoller
from bench.harness import (
    CpuMeter,
    Infra,
    create_topics,
    message_event,
    new_worker,
    note,
    percentile,
    print_header,
    produce,
    running,
    table,
    unique_prefix,
    wait_assigned,
    worker_config,
)
from core.domain.budget import BudgetConfig
from core.domain.tokens import estimate_message_tokens
from streams.events import ClipArchiveEvent, MessageEvent
from streams.topics import TopicNames
from tests.support.worker import WorkerProcess

SETTLE_SECONDS = 1.5


@dataclass
class Run:
    concurrency: int
    compact_at: float | None
    budget: BudgetConfig
    conversations: int
    burst_ratio: float  # tokens the burst brings each conversation ÷ budget
    accounted_seconds: float = math.nan  # burst produced → last burst event accounted
    settled_seconds: float = math.nan  # burst produced → settled (or timed out)
    settled: bool = False
    over_seconds: float = 0.0  # conversation-seconds over budget
    window_seconds: float = 0.0
    samples: int = 0
    sample_pairs: int = 0
    sample_pairs_over: int = 0
    sampled_max_ratio: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    loaded_ratios: list[float] = field(default_factory=list)  # clip-archive tokens_before
    llm_calls: int = 0
    peak_llm: int = 0
    peak_in_flight: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)


class StoreSampler:
    """Sums each conversation's stored tokens every ``interval`` seconds and
    integrates the time each spends over the budget."""

    def __init__(self, dsn: str, prefix: str, budget_tokens: int, interval: float) -> None:
        self.dsn = dsn
        self.prefix = prefix
        self.budget_tokens = budget_tokens
        self.interval = interval
        self.totals: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._run: Run | None = None

    async def _loop(self, run: Run) -> None:
        connection = await asyncpg.connect(self.dsn)
        previous: tuple[float, set[str]] | None = None
        try:
            while True:
                rows = await connection.fetch(
                    "SELECT conversation_id, sum(token_estimate)::bigint AS total FROM messages"
                    " WHERE conversation_id LIKE $1 GROUP BY conversation_id",
                    self.prefix + "%",
                )
                now = time.monotonic()
                self.totals = {row["conversation_id"]: int(row["total"]) for row in rows}
                over = {c for c, total in self.totals.items() if total > self.budget_tokens}
                if previous is not None:
                    run.over_seconds += (now - previous[0]) * len(previous[1])
                    run.window_seconds += now - previous[0]
                previous = (now, over)
                run.samples += 1
                run.sample_pairs += len(self.totals)
                run.sample_pairs_over += len(over)
                if self.totals:
                    peak = max(self.totals.values()) / self.budget_tokens
                    run.sampled_max_ratio = max(run.sampled_max_ratio, peak)
                await asyncio.sleep(self.interval)
        finally:
            await connection.close()

    def start(self, run: Run) -> None:
        self._task = asyncio.create_task(self._loop(run))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class ClipCollector:
    """Every clip-archive event of the run: what each compaction loaded."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.events: dict[str, ClipArchiveEvent] = {}  # by compaction id (at least once)
        self._tps = [TopicPartition(topic, p) for p in range(partitions)]
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
        )
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._consumer.start()
        self._consumer.assign(self._tps)
        await self._consumer.seek_to_beginning(*self._tps)
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            batches = await self._consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for record in records:
                    if record.value:
                        event = ClipArchiveEvent.model_validate_json(record.value)
                        self.events[event.compaction_id] = event

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()


# --------------------------------------------------------------------------- workload


def conversation_ids(tag: str, count: int) -> list[str]:
    return [f"{tag}-{i:04d}" for i in range(count)]


def tokens_per_message(words: int) -> int:
    return estimate_message_tokens(message_event("c", 1, words=words).to_message())


def prefill_events(
    conversations: list[str], args: argparse.Namespace, budget: BudgetConfig
) -> list[MessageEvent]:
    """Staggered: conversation k of N holds k/N of what fits under the target."""
    if args.prefill == "none":
        return []
    fits = budget.target_tokens // tokens_per_message(args.words)
    return [
        message_event(c, i, words=args.words)
        for k, c in enumerate(conversations)
        for i in range(fits * k // len(conversations))
    ]


def burst_events(
    conversations: list[str], prefilled: list[MessageEvent], args: argparse.Namespace
) -> list[MessageEvent]:
    """Round-robin over the conversations, each continuing its own numbering."""
    next_index = {c: 0 for c in conversations}
    for event in prefilled:
        next_index[event.conversation_id] += 1
    events = []
    for n in range(args.events):
        conversation_id = conversations[n % len(conversations)]
        events.append(message_event(conversation_id, next_index[conversation_id], words=args.words))
        next_index[conversation_id] += 1
    return events


async def produce_paced(
    bootstrap: str, topic: str, events: list[MessageEvent], rate: float
) -> None:
    """``rate`` events per second, in 10 ms ticks: the steady traffic the soft
    trigger is for (a compaction finishes before the next few messages land)."""
    per_tick = max(1, round(rate * 0.01))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        started = time.monotonic()
        for n, start in enumerate(range(0, len(events), per_tick)):
            sent = [
                await producer.send(
                    topic, key=e.conversation_id.encode(), value=e.model_dump_json().encode()
                )
                for e in events[start : start + per_tick]
            ]
            await asyncio.gather(*sent)
            await asyncio.sleep(max(0.0, started + (n + 1) * per_tick / rate - time.monotonic()))
    finally:
        await producer.stop()


# --------------------------------------------------------------------------- one run


async def wait_until(
    check: Any, worker: WorkerProcess, within: float, what: str, hold: float = 0.0
) -> bool:
    """Until ``check()`` has held for ``hold`` seconds; False after ``within``."""
    deadline = time.monotonic() + within
    since: float | None = None
    while time.monotonic() < deadline:
        if not worker.alive:
            raise RuntimeError(f"worker exited; log:\n{worker.log_tail()}")
        if check():
            since = since if since is not None else time.monotonic()
            if time.monotonic() - since >= hold:
                return True
        else:
            since = None
        await asyncio.sleep(0.05)
    note(f"timed out waiting for {what}")
    return False


async def run_one(
    run: Run, infra: Infra, server: CountingLLMServer, args: argparse.Namespace
) -> None:
    assert infra.bootstrap is not None
    tag = f"c{run.concurrency}-{run.compact_at or 'none'}"
    prefix = unique_prefix(f"burst{run.concurrency}")
    names = await create_topics(infra.bootstrap, prefix, args.partitions)
    config = worker_config(
        topic_prefix=prefix,
        partitions=args.partitions,
        store=args.store,
        max_concurrent_compactions=run.concurrency,
        budget=(run.budget.context_budget, run.budget.model_max_tokens),
        llm_base_url=server.openai_base_url,
    )
    if run.compact_at is not None:
        config["budget"]["compact_at"] = run.compact_at
    dsn = await infra.new_database()
    worker = new_worker(infra, f"worker-{tag}", dsn, config)
    note(f"{tag}: starting a worker")
    with running(worker):
        await wait_assigned(worker, names.messages, args.partitions)
        await measure(run, infra, worker, server, names, dsn, tag, args)


async def measure(
    run: Run,
    infra: Infra,
    worker: WorkerProcess,
    server: CountingLLMServer,
    names: TopicNames,
    dsn: str,
    tag: str,
    args: argparse.Namespace,
) -> None:
    assert infra.bootstrap is not None
    conversations = conversation_ids(tag, args.conversations)
    prefilled = prefill_events(conversations, args, run.budget)
    burst = burst_events(conversations, prefilled, args)
    poller = MetricsPoller(worker.url, interval=0.1)
    poller.start()
    clips = ClipCollector(infra.bootstrap, names.clip_archives, args.partitions)
    await clips.start()
    sampler = StoreSampler(dsn, tag, run.budget.budget_tokens, args.sample_ms / 1000)
    try:
        if prefilled:
            note(f"{tag}: prefill, {len(prefilled)} events")
            await produce(infra.bootstrap, names.messages, prefilled)
            await wait_until(
                lambda: accounted(poller) >= len(prefilled), worker, args.timeout, "prefill"
            )
        server.reset_counts()
        poller.peak = 0.0
        meter = CpuMeter(
            {"worker": worker.pid, "broker": infra.broker_pid, "postgres": infra.postgres_pid}
        ).start()
        sampler.start(run)
        note(f"{tag}: burst, {len(burst)} events")
        started = time.monotonic()
        if args.rate > 0:
            await produce_paced(infra.bootstrap, names.messages, burst, args.rate)
        else:
            await produce(infra.bootstrap, names.messages, burst)
        expected = len(prefilled) + len(burst)
        await wait_until(lambda: accounted(poller) >= expected, worker, args.timeout, "the burst")
        run.accounted_seconds = time.monotonic() - started
        run.settled = await wait_until(
            lambda: settled(poller, sampler, run.budget, expected, len(conversations)),
            worker,
            max(1.0, args.timeout - run.accounted_seconds),
            "the compactions",
            hold=SETTLE_SECONDS,
        )
        run.settled_seconds = time.monotonic() - started - (SETTLE_SECONDS if run.settled else 0)
        run.cpu = meter.stop()
    finally:
        await sampler.stop()
        await asyncio.sleep(0.3)  # a last /metrics sample, the last clip-archives
        await poller.stop()
        await clips.stop()
    collect(run, poller, clips, server)


def accounted(poller: MetricsPoller) -> float:
    return poller.last.get("compactor_events_in_total", 0.0)


def settled(
    poller: MetricsPoller,
    sampler: StoreSampler,
    budget: BudgetConfig,
    expected: int,
    conversations: int,
) -> bool:
    return (
        accounted(poller) >= expected
        and poller.last.get("compactor_compactions_in_flight", 1.0) == 0
        and len(sampler.totals) == conversations
        and all(total <= budget.trigger_tokens for total in sampler.totals.values())
    )


def collect(
    run: Run, poller: MetricsPoller, clips: ClipCollector, server: CountingLLMServer
) -> None:
    run.metrics = dict(poller.last)
    run.peak_in_flight = poller.peak
    run.peak_llm = server.peak
    run.llm_calls = server.served
    budget_tokens = run.budget.budget_tokens
    run.loaded_ratios = [e.tokens_before / budget_tokens for e in clips.events.values()]


# --------------------------------------------------------------------------- report


def bucket_over(metrics: dict[str, float], bound: str) -> int:
    """Observations of the ratio histogram above ``bound`` (a bucket's ``le``)."""
    count = metrics.get("compactor_history_budget_ratio_count", 0.0)
    return int(count - metrics.get(f'compactor_history_budget_ratio_bucket{{le="{bound}"}}', 0.0))


def row(run: Run, events: int) -> tuple[Any, ...]:
    m = run.metrics
    loaded = run.loaded_ratios or [math.nan]
    compactions = int(m.get("compactor_compactions_succeeded_total", 0.0))
    share = run.over_seconds / max(1e-9, run.window_seconds * run.conversations)
    return (
        run.budget.budget_tokens,
        f"{run.burst_ratio:.2f}",
        run.concurrency,
        "none" if run.compact_at is None else f"{run.compact_at:g}",
        f"{events / run.accounted_seconds:.0f}",
        f"{run.settled_seconds:.1f}" + ("" if run.settled else " (timeout)"),
        compactions,
        "/".join(
            str(int(m.get(f'compactor_compactions_noop_total{{reason="{reason}"}}', 0.0)))
            for reason in ("replayed", "under_budget", "nothing_to_compress")
        ),
        int(m.get("compactor_compactions_failed_total", 0.0)),
        run.llm_calls,
        f"{run.peak_in_flight:.0f}/{run.peak_llm}",
        f"{percentile(loaded, 50):.2f}",
        f"{max(loaded):.2f}",
        f"{m.get('compactor_history_budget_ratio_max', math.nan):.2f}",
        f"{bucket_over(m, '1.0')}/{bucket_over(m, '1.5')}",
        f"{run.sampled_max_ratio:.2f}",
        f"{run.over_seconds:.0f}",
        f"{100 * share:.1f}%",
        f"{100 * run.sample_pairs_over / max(1, run.sample_pairs):.1f}%",
        f"{run.cpu.get('worker', math.nan):.0f}%",
        f"{run.cpu.get('machine', math.nan):.0f}%",
    )


def report(runs: list[Run], args: argparse.Namespace) -> None:
    headers = (
        "budget",
        "burst ÷ budget",
        "max_concurrent",
        "compact_at",
        "accounted/s",
        "settled s",
        "compactions",
        "noop replayed/under/nothing",
        "failed",
        "LLM calls",
        "peak in flight/LLM",
        "loaded p50",
        "loaded max",
        "stored max",
        "stored >1/>1.5",
        "sampled max",
        "over-budget conv·s",
        "share of conv·s",
        "reader saw over",
        "worker CPU",
        "machine busy",
    )
    print(table(headers, [row(run, args.events) for run in runs]))
    print(
        "\naccounted/s: burst events ÷ seconds from the first produced to the last accounted;"
        "\nsettled s: from the burst's start until every event is accounted, nothing is in"
        " flight and every conversation is at or under the trigger;"
        "\nloaded: clip-archive tokens_before ÷ budget (what each compaction loaded, up to its"
        " command's cut);\nstored max: compactor_history_budget_ratio_max, the conversation's"
        " stored history ÷ budget when the compaction loaded it (every row, including those"
        " past the cut);\nstored >1/>1.5: compactions whose stored ratio exceeded 1 / 1.5"
        " (histogram buckets);\nsampled max: the largest stored ratio seen by the"
        f" {args.sample_ms:g} ms sampler;\nover-budget conv·s: sum over conversations of the"
        " seconds their stored history was over budget, from the burst's start to settled;"
        "\nshare of conv·s: that ÷ (conversations × window); reader saw over: share of"
        " (sample, conversation) pairs over budget;\nworker CPU: % of one core; machine busy:"
        " all cores, whoever used them (other sessions share this machine)."
    )


# --------------------------------------------------------------------------- main


async def run_all(args: argparse.Namespace, infra: Infra) -> list[Run]:
    runs = []
    server = CountingLLMServer(latency_seconds=args.latency_ms / 1000)
    await server.start()
    try:
        for budget_tokens in args.budget_tokens:
            for concurrency in args.concurrency:
                for compact_at in args.compact_at:
                    budget = bench_budget(budget_tokens, compact_at)
                    run = Run(
                        concurrency,
                        compact_at,
                        budget,
                        args.conversations,
                        burst_ratio(args, budget),
                    )
                    await run_one(run, infra, server, args)
                    runs.append(run)
    finally:
        await server.close()
    return runs


def rate_text(rate: float) -> str:
    return f"produced at {rate:g} events/s" if rate > 0 else "produced as fast as possible"


def bench_budget(budget_tokens: int, compact_at: float | None) -> BudgetConfig:
    """``budget_tokens`` as 0.8 × a model window, like the shipped default."""
    return BudgetConfig(
        context_budget=0.8, model_max_tokens=budget_tokens * 5 // 4, compact_at=compact_at
    )


def burst_ratio(args: argparse.Namespace, budget: BudgetConfig) -> float:
    events: int = args.events
    per_conversation = events / args.conversations * tokens_per_message(args.words)
    return float(per_conversation / budget.budget_tokens)


def ratio_or_none(text: str) -> float | None:
    return None if text.lower() == "none" else float(text)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.burst",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=10_000, help="burst size")
    parser.add_argument("--conversations", type=int, default=100)
    parser.add_argument("--latency-ms", type=float, default=500.0, help="LLM reply delay")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 64])
    parser.add_argument(
        "--compact-at", type=ratio_or_none, nargs="+", default=[None, 0.85], help="none or ratio"
    )
    parser.add_argument(
        "--budget-tokens", type=int, nargs="+", default=[8000], help="budgets to run"
    )
    parser.add_argument("--words", type=int, default=60, help="words per message")
    parser.add_argument("--prefill", choices=["staggered", "none"], default="staggered")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="events/s for the burst; 0 = as fast as possible"
    )
    parser.add_argument("--sample-ms", type=float, default=50.0)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--store", choices=["rocksdb://", "memory://"], default="rocksdb://")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument(
        "--quick", action="store_true", help="1000 events, 20 conversations, concurrency 4"
    )
    args = parser.parse_args()
    if args.quick:  # smaller defaults; options given explicitly still win
        parser.set_defaults(events=1000, conversations=20, concurrency=[4], timeout=180.0)
        args = parser.parse_args()
    return args


def main() -> None:
    args = parse_args()
    print_header("bursts: history ÷ budget at each compaction, time over budget", "bench.burst")
    with Infra(partitions=args.partitions) as infra:
        print(infra.describe())
        print(
            f"workload: {args.events} message events over {args.conversations} conversations,"
            f" round-robin, {rate_text(args.rate)}, prefill {args.prefill};"
            f" ~{tokens_per_message(args.words)} tokens per"
            f" message ({args.words} words); target 0.8 × budget; LLM reply after {args.latency_ms:g} ms; default"
            f" [summarization] (chunk_size 20, keep_recent 5); store {args.store}\n"
        )
        runs = asyncio.run(run_all(args, infra))
    report(runs, args)


if __name__ == "__main__":
    main()
