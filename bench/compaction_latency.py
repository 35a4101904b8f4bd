"""End-to-end compaction latency of one worker, with an LLM that answers in fixed time.

For every ``--concurrency`` value (the worker's max_concurrent_compactions) a
worker is started against a local OpenAI-compatible test server
(``tests.support.llm_server``, run inside this process so it can count the
requests it is serving at once). For every ``--latency-ms`` value:

* direct      the compaction alone, no Kafka: ``PipelineCompactor.plan``
              in this process, same LLM server, same PostgreSQL (the baseline);
* serial      one conversation at a time goes over budget (no queueing): the
              time from producing the over-budget message event to consuming
              its clip-archive event from the output topic;
* burst       M conversations go over budget at once (M events produced
              back to back), timed the same way for each.

Each conversation first gets ``--messages`` events of 300 tokens (under the
budget of 8 000), then one of 3 000 that puts it over: one compaction of one
LLM call (15 older messages, chunk_size 20). Latencies are matched by
conversation id and the compaction id of generation 0.

"to command" splits that time: the over-budget event produced → its
compaction command seen on the commands topic (the accounting agent's part);
"worker mean" is the worker's own compactor_compaction_latency_seconds
(command issued → events published) over the phase.

A second table splits each compaction's time by the wall clocks the events
carry: event produced → command ``issued_at`` → clip-archive ``created_at``
(inside the compaction transaction) → the clip-archive record's timestamp →
consumed here. A plain aiokafka produce → consume round trip, timed once per
worker, is the floor under every Kafka hop.

"peak in flight" is the worker's compactor_compactions_in_flight gauge,
sampled on /metrics every 20 ms; "peak LLM" is the most chat requests the LLM
server was serving at once (exact). The ideal burst figures assume
``concurrency`` compactions at a time, each as long as the direct median.

P3, a thousand at once (``--scenario p3``): one worker with the shipped
defaults (max_concurrent_compactions, LLM call cap, pool size; override with
``--p3-concurrency``) gets ``--p3-conversations`` conversations prefilled,
then all of them pushed over budget back to back, once per ``--p3-latency-ms``.
"drain" runs from the first over-budget event produced to the last
clip-archive consumed; "peak in flight" is sampled as above; CPU is the
worker's process tree (% of one core) and the whole machine (% of all cores)
over the drain. ``--py-spy FILE`` records the worker with py-spy during each
drain (FILE.<latency>ms.txt, raw collapsed stacks), when py-spy is installed.

CPU (``--scenario cpu``): ``Processor.compact`` for ``--cpu-compactions``
conversations in this process, without Kafka, against real PostgreSQL and the
LLM test server at 0 ms: CPU milliseconds per compaction (this process), a
figure that moves far less with the machine's other load than a drain rate.

    python -m bench.compaction_latency [--conversations 40] [--latency-ms 0 500] [--concurrency 4 16]
    python -m bench.compaction_latency --scenario p3 [--p3-conversations 1000] [--p3-latency-ms 500 0]
    python -m bench.compaction_latency --quick

``--json FILE`` also writes the figures as JSON for ``bench.plot``: ``latency``
(one object per serial/burst phase: max_concurrent, llm_ms, phase, n, p50_ms,
p95_ms, compactions_per_s, peak_in_flight), ``p3`` (conversations, llm_ms,
drain_s, rate_per_s, peak_in_flight, peak_llm) and ``cpu``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.harness import (
    CpuMeter,
    Infra,
    WorkerProcess,
    create_topics,
    message_event,
    new_worker,
    note,
    parse_metrics,
    percentile,
    print_header,
    produce,
    running,
    table,
    unique_prefix,
    wait_assigned,
    worker_config,
)
from core.adapters.llm.factory import build_model_provider
from core.adapters.postgres.store import PostgresStore
from core.compaction.compactor import PipelineCompactor
from core.compaction.factory import create_compactor
from core.domain.budget import BudgetConfig
from core.domain.compaction import Planned
from core.domain.tally import compaction_id_for
from core.settings import SummarizationSettings, resolve_model
from streams.events import ClipArchiveEvent, CompactionCommand, MessageEvent
from streams.topics import TopicNames
from tests.support.llm_server import (
    LLMTestServer,
    Protocol,
    RecordedRequest,
    model_like_responder,
)
from tests.support.stores import saved

BUDGET = (0.8, 10_000)  # 8 000 tokens
SMALL_TOKENS = 300
BIG_TOKENS = 3_000


class CountingLLMServer(LLMTestServer):
    """The test server, also counting the chat requests it is serving at once."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("responder", model_like_responder)  # summaries the gate passes
        super().__init__(**kwargs)
        self.active = 0
        self.peak = 0
        self.served = 0

    def reset_counts(self) -> None:
        self.peak = self.active
        self.served = 0
        self.requests.clear()

    async def _serve_chat(
        self, protocol: Protocol, recorded: RecordedRequest
    ) -> web.StreamResponse:
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            return await super()._serve_chat(protocol, recorded)
        finally:
            self.active -= 1
            self.served += 1


@dataclass
class Phase:
    concurrency: int
    latency_ms: float
    name: str
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0  # first event produced to last clip-archive consumed
    peak_in_flight: float | None = None
    peak_llm: int | None = None
    llm_calls: int | None = None
    ideal_seconds: float | None = None
    worker_mean: float | None = None  # the worker's own command → published histogram
    to_command: list[float] = field(default_factory=list)  # event sent → command on its topic
    # Per compaction, from wall clocks on this machine: sent → command issued_at,
    # → clip-archive created_at (in the compaction transaction), → its record
    # timestamp (the relay's send), → consumed here.
    stages: list[tuple[float, float, float, float]] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)  # worker, machine over the phase

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else float("nan")


class ArrivalCollector:
    """Reads a topic from its start; notes when each conversation's generation-0
    compaction first appeared on it (a command, or a clip-archive event)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        model: type[ClipArchiveEvent] | type[CompactionCommand],
    ) -> None:
        self.topic = topic
        self.partitions = partitions
        self.model = model
        self.arrived: dict[str, float] = {}  # conversation id → time.time() of arrival
        self.records: dict[str, tuple[Any, float]] = {}  # → (event, record timestamp)
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
        )
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    async def start(self) -> None:
        await self._consumer.start()
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        self._consumer.assign(tps)
        await self._consumer.seek_to_beginning(*tps)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            batches = await self._consumer.getmany(timeout_ms=200)
            now = time.time()
            for records in batches.values():
                for record in records:
                    event = self.model.model_validate_json(record.value or b"")
                    conversation_id = event.conversation_id
                    if event.compaction_id != compaction_id_for(conversation_id, 0):
                        continue
                    if conversation_id not in self.arrived:
                        self.arrived[conversation_id] = now
                        self.records[conversation_id] = (event, record.timestamp / 1000)
            if batches:
                self._changed.set()

    async def wait_for(self, conversations: list[str], within: float) -> None:
        deadline = time.monotonic() + within
        while not all(c in self.arrived for c in conversations):
            if self._task is not None and self._task.done():
                self._task.result()
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [c for c in conversations if c not in self.arrived]
                raise TimeoutError(
                    f"no clip-archive for {len(missing)} conversations: {missing[:3]}"
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(left, 1.0))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()


class MetricsPoller:
    """Samples /metrics every ``interval`` seconds; remembers the gauge's peak."""

    def __init__(self, url: str, interval: float = 0.02) -> None:
        self.url = url
        self.interval = interval
        self.peak = 0.0
        self.last: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(f"{self.url}/metrics") as response:
                        self.last = parse_metrics(await response.text())
                    self.peak = max(
                        self.peak, self.last.get("compactor_compactions_in_flight", 0.0)
                    )
                await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def prefill_events(conversation_id: str, messages: int) -> list[MessageEvent]:
    return [
        message_event(conversation_id, i, token_count=SMALL_TOKENS, words=40)
        for i in range(messages)
    ]


def over_budget_event(conversation_id: str, messages: int) -> MessageEvent:
    return message_event(conversation_id, messages, token_count=BIG_TOKENS, words=40)


async def wait_accounted(poller: MetricsPoller, worker: WorkerProcess, expected: float) -> None:
    deadline = time.monotonic() + 300
    while poller.last.get("compactor_events_in_total", 0.0) < expected:
        if not worker.alive:
            raise RuntimeError(f"worker exited; log:\n{worker.log_tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"events not accounted: {poller.last}")
        await asyncio.sleep(0.05)


async def send_over_budget(
    producer: AIOKafkaProducer, topic: str, conversations: list[str], messages: int
) -> dict[str, float]:
    """Produce each conversation's over-budget event back to back; returns send times."""
    sent: dict[str, float] = {}
    futures = []
    for conversation_id in conversations:
        event = over_budget_event(conversation_id, messages)
        sent[conversation_id] = time.time()
        futures.append(
            await producer.send(
                topic, key=conversation_id.encode(), value=event.model_dump_json().encode()
            )
        )
    await asyncio.gather(*futures)
    return sent


async def kafka_hop(bootstrap: str, topic: str, partitions: int, samples: int = 20) -> float:
    """Median produce (acks=all) → consume time of one small record, plain aiokafka:
    the floor under every hop between the service's stages."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await producer.start()
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        hops = []
        for i in range(samples):
            started = time.time()
            await producer.send_and_wait(topic, b"hop", key=f"hop-{i}".encode())
            while not await consumer.getmany(timeout_ms=1000):
                pass
            hops.append(time.time() - started)
    finally:
        await producer.stop()
        await consumer.stop()
    return statistics.median(hops)


async def close_model(model: object) -> None:
    """Close the provider's HTTP client inside its own event loop: left to the garbage
    collector, its ``aclose`` task ran in a later ``asyncio.run`` ("Event loop is closed")."""
    aclose = getattr(model, "aclose", None)
    if aclose is not None:
        await aclose()


async def bench_compactor(
    infra: Infra, base_url: str, budget: BudgetConfig | None = None
) -> tuple[Any, PostgresStore, PipelineCompactor]:
    """The model, a store over a fresh database and the compactor over both, built as
    the worker builds them, against the LLM test server at ``base_url``."""
    settings = SummarizationSettings(
        provider="openai", base_url=base_url, model="bench-model", max_retries=0
    )
    resolved = resolve_model(settings, environ={})
    model = build_model_provider(resolved, timeout_seconds=settings.timeout_seconds)
    store = await PostgresStore.connect(await infra.new_database())
    compactor = create_compactor(
        model=model,
        memory=store.archive,
        config=settings.compaction(),
        model_name=resolved.model,
        budget=budget,
    )
    return model, store, compactor


async def direct_baseline(
    infra: Infra, server: CountingLLMServer, args: argparse.Namespace, tag: str
) -> list[float]:
    """``plan`` alone (plus loading the history), as the processor calls it."""
    model, store, compactor = await bench_compactor(infra, server.openai_base_url)
    times = []
    try:
        for i in range(args.direct):
            conversation_id = f"{tag}-direct-{i}"
            events = [
                *prefill_events(conversation_id, args.messages),
                over_budget_event(conversation_id, args.messages),
            ]
            for event in events:
                await saved(store, event.to_message(), event.token_count or 0)
            started = time.perf_counter()
            history = await store.history.load_history(conversation_id)
            outcome = await compactor.plan(history, conversation_id, compaction_id=f"{tag}-{i}")
            times.append(time.perf_counter() - started)
            if not isinstance(outcome, Planned) or not outcome.plan.messages_compressed:
                raise RuntimeError(f"direct compaction failed: {outcome}")
    finally:
        await store.close()
        await close_model(model)
    return times


async def run_phase(
    phase: Phase,
    conversations: list[str],
    *,
    infra: Infra,
    names: TopicNames,
    args: argparse.Namespace,
    worker: WorkerProcess,
    server: CountingLLMServer,
    poller: MetricsPoller,
    producer: AIOKafkaProducer,
    collector: ArrivalCollector,
    commands: ArrivalCollector,
    accounted: float,
) -> float:
    """Prefill, then push every conversation of the phase over budget; returns events counted."""
    assert infra.bootstrap is not None
    prefill = [e for c in conversations for e in prefill_events(c, args.messages)]
    await produce(infra.bootstrap, names.messages, prefill)
    accounted += len(prefill)
    await wait_accounted(poller, worker, accounted)
    batches = [conversations] if phase.name == "burst" else [[c] for c in conversations]
    server.reset_counts()
    poller.peak = 0.0
    histogram = (
        poller.last.get("compactor_compaction_latency_seconds_sum", 0.0),
        poller.last.get("compactor_compaction_latency_seconds_count", 0.0),
    )
    meter = CpuMeter({"worker": worker.pid}).start()
    started = time.time()
    for batch in batches:
        sent = await send_over_budget(producer, names.messages, batch, args.messages)
        await collector.wait_for(batch, within=args.timeout)
        phase.latencies.extend(collector.arrived[c] - sent[c] for c in batch)
        await commands.wait_for(batch, within=args.timeout)
        phase.to_command.extend(commands.arrived[c] - sent[c] for c in batch)
        for c in batch:
            command: CompactionCommand = commands.records[c][0]
            clip, published = collector.records[c]
            issued = command.issued_at.timestamp()
            created = clip.created_at.timestamp()
            phase.stages.append(
                (
                    issued - sent[c],
                    created - issued,
                    published - created,
                    collector.arrived[c] - published,
                )
            )
    phase.seconds = max(collector.arrived[c] for c in conversations) - started
    phase.cpu = meter.stop()
    await asyncio.sleep(0.1)  # one more /metrics sample
    count = poller.last.get("compactor_compaction_latency_seconds_count", 0.0) - histogram[1]
    if count:
        total = poller.last.get("compactor_compaction_latency_seconds_sum", 0.0) - histogram[0]
        phase.worker_mean = total / count
    phase.peak_in_flight = poller.peak
    phase.peak_llm = server.peak
    phase.llm_calls = server.served
    return accounted + len(conversations)


async def run(
    args: argparse.Namespace, infra: Infra
) -> tuple[list[Phase], list[Phase], list[float]]:
    assert infra.bootstrap is not None
    phases: list[Phase] = []
    directs: list[Phase] = []
    hops: list[float] = []
    server = CountingLLMServer()
    await server.start()
    try:
        for concurrency in args.concurrency:
            prefix = unique_prefix(f"lat{concurrency}")
            names = await create_topics(infra.bootstrap, prefix, args.partitions)
            config = worker_config(
                topic_prefix=prefix,
                partitions=args.partitions,
                store=args.store,
                max_concurrent_compactions=concurrency,
                budget=BUDGET,
                llm_base_url=server.openai_base_url,
            )
            worker = new_worker(infra, f"worker-c{concurrency}", await infra.new_database(), config)
            note(f"starting a worker with max_concurrent_compactions = {concurrency}")
            with running(worker):
                await wait_assigned(worker, names.messages, args.partitions)
                # The dead-letters topic stays empty here: a free topic to time a hop on.
                hops.append(await kafka_hop(infra.bootstrap, names.dead_letters, args.partitions))
                collector = ArrivalCollector(
                    infra.bootstrap, names.clip_archives, args.partitions, ClipArchiveEvent
                )
                await collector.start()
                commands = ArrivalCollector(
                    infra.bootstrap, names.commands, args.partitions, CompactionCommand
                )
                await commands.start()
                poller = MetricsPoller(worker.url)
                poller.start()
                producer = AIOKafkaProducer(bootstrap_servers=infra.bootstrap, acks="all")
                await producer.start()
                accounted = 0.0
                try:
                    for latency_ms in args.latency_ms:
                        server.latency_seconds = latency_ms / 1000
                        tag = f"c{concurrency}-l{latency_ms:g}"
                        note(f"{tag}: direct baseline")
                        direct = Phase(concurrency, latency_ms, "direct")
                        direct.latencies = await direct_baseline(infra, server, args, tag)
                        directs.append(direct)
                        median_direct = statistics.median(direct.latencies)
                        for name, count in (("serial", args.serial), ("burst", args.conversations)):
                            note(f"{tag}: {name} phase, {count} conversations")
                            phase = Phase(concurrency, latency_ms, name)
                            accounted = await run_phase(
                                phase,
                                [f"{tag}-{name}-{i:04d}" for i in range(count)],
                                infra=infra,
                                names=names,
                                args=args,
                                worker=worker,
                                server=server,
                                poller=poller,
                                producer=producer,
                                collector=collector,
                                commands=commands,
                                accounted=accounted,
                            )
                            if name == "burst":
                                rounds = math.ceil(count / concurrency)
                                phase.ideal_seconds = rounds * median_direct
                            phases.append(phase)
                finally:
                    await producer.stop()
                    await poller.stop()
                    await collector.stop()
                    await commands.stop()
    finally:
        await server.close()
    return phases, directs, hops


@dataclass
class Drain:
    """P3: many conversations pushed over budget at once, drained by one worker."""

    latency_ms: float
    conversations: int
    seconds: float = 0.0  # first over-budget event produced → last clip-archive consumed
    commands_seconds: float = 0.0  # first event produced → last command seen
    latencies: list[float] = field(default_factory=list)
    peak_in_flight: float = 0.0
    peak_llm: int = 0
    llm_calls: int = 0
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.conversations / self.seconds if self.seconds else float("nan")


def start_py_spy(path: str | None, pid: int, latency_ms: float) -> subprocess.Popen[bytes] | None:
    """py-spy recording the worker (raw collapsed stacks), if asked for and installed."""
    exe = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if path is None or exe is None:
        if path is not None:
            note("py-spy not found; not profiling")
        return None
    out = f"{path}.{latency_ms:g}ms.txt"
    note(f"py-spy recording the worker to {out}")
    return subprocess.Popen(
        [
            exe,
            "record",
            "--pid",
            str(pid),
            "-f",
            "raw",
            "-o",
            out,
            "--rate",
            "200",
            "--subprocesses",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_py_spy(spy: subprocess.Popen[bytes] | None) -> None:
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()


async def drain_once(
    drain: Drain,
    *,
    args: argparse.Namespace,
    ctx: dict[str, Any],
    accounted: float,
) -> float:
    """Prefill ``drain.conversations``, push them all over budget, wait for every
    clip-archive; returns the events the worker has now counted."""
    infra: Infra = ctx["infra"]
    names: TopicNames = ctx["names"]
    worker: WorkerProcess = ctx["worker"]
    server: CountingLLMServer = ctx["server"]
    poller: MetricsPoller = ctx["poller"]
    collector: ArrivalCollector = ctx["collector"]
    commands: ArrivalCollector = ctx["commands"]
    assert infra.bootstrap is not None
    conversations = [f"p3-l{drain.latency_ms:g}-{i:05d}" for i in range(drain.conversations)]
    prefill = [e for c in conversations for e in prefill_events(c, args.messages)]
    note(f"P3 {drain.latency_ms:g} ms: prefilling {len(prefill)} events")
    await produce(infra.bootstrap, names.messages, prefill)
    accounted += len(prefill)
    await wait_accounted(poller, worker, accounted)
    server.reset_counts()
    poller.peak = 0.0
    note(f"P3 {drain.latency_ms:g} ms: {drain.conversations} conversations over budget at once")
    spy = start_py_spy(args.py_spy, worker.pid, drain.latency_ms)
    meter = CpuMeter({"worker": worker.pid}).start()
    started = time.time()
    own = time.process_time()
    try:
        sent = await send_over_budget(ctx["producer"], names.messages, conversations, args.messages)
        await collector.wait_for(conversations, within=args.timeout)
        drain.cpu = meter.stop()
        # This process: the LLM test server, the producer and the consumers.
        drain.cpu["bench"] = 100 * (time.process_time() - own) / (time.time() - started)
        await commands.wait_for(conversations, within=args.timeout)
    finally:
        stop_py_spy(spy)
    drain.seconds = max(collector.arrived[c] for c in conversations) - started
    drain.commands_seconds = max(commands.arrived[c] for c in conversations) - started
    drain.latencies = [collector.arrived[c] - sent[c] for c in conversations]
    await asyncio.sleep(0.1)  # one more /metrics sample
    drain.peak_in_flight = poller.peak
    drain.peak_llm = server.peak
    drain.llm_calls = server.served
    return accounted + len(conversations)


async def run_p3(args: argparse.Namespace, infra: Infra) -> list[Drain]:
    """One worker with the shipped defaults drains ``--p3-conversations`` at once."""
    assert infra.bootstrap is not None
    drains: list[Drain] = []
    server = CountingLLMServer()
    await server.start()
    try:
        prefix = unique_prefix("p3")
        names = await create_topics(infra.bootstrap, prefix, args.partitions)
        config = worker_config(
            topic_prefix=prefix,
            partitions=args.partitions,
            store=args.store,
            max_concurrent_compactions=args.p3_concurrency,
            budget=BUDGET,
            llm_base_url=server.openai_base_url,
            pool_max_size=args.p3_pool,
        )
        worker = new_worker(infra, "worker-p3", await infra.new_database(), config)
        note(
            f"P3: starting a worker (max_concurrent_compactions {args.p3_concurrency or 'default'})"
        )
        with running(worker):
            await wait_assigned(worker, names.messages, args.partitions)
            ctx: dict[str, Any] = {
                "infra": infra,
                "names": names,
                "worker": worker,
                "server": server,
            }
            ctx["collector"] = ArrivalCollector(
                infra.bootstrap, names.clip_archives, args.partitions, ClipArchiveEvent
            )
            ctx["commands"] = ArrivalCollector(
                infra.bootstrap, names.commands, args.partitions, CompactionCommand
            )
            # Every 100 ms, not 20: rendering /metrics 50 times a second cost the
            # worker about 5 % of its CPU, and the gauge peaks here last seconds.
            ctx["poller"] = MetricsPoller(worker.url, interval=0.1)
            ctx["producer"] = AIOKafkaProducer(bootstrap_servers=infra.bootstrap, acks="all")
            await ctx["collector"].start()
            await ctx["commands"].start()
            ctx["poller"].start()
            await ctx["producer"].start()
            accounted = 0.0
            try:
                for latency_ms in args.p3_latency_ms:
                    server.latency_seconds = latency_ms / 1000
                    drain = Drain(latency_ms, args.p3_conversations)
                    accounted = await drain_once(drain, args=args, ctx=ctx, accounted=accounted)
                    drains.append(drain)
            finally:
                await ctx["producer"].stop()
                await ctx["poller"].stop()
                await ctx["collector"].stop()
                await ctx["commands"].stop()
    finally:
        await server.close()
    return drains


def report_p3(drains: list[Drain], args: argparse.Namespace) -> None:
    rows = [
        (
            f"{d.latency_ms:g}",
            d.conversations,
            f"{d.seconds:.1f}",
            f"{d.commands_seconds:.1f}",
            f"{d.rate:.1f}",
            ms(percentile(d.latencies, 50)),
            ms(percentile(d.latencies, 99)),
            f"{d.peak_in_flight:.0f}",
            d.peak_llm,
            f"{d.llm_calls / d.conversations:.2f}",
            f"{d.cpu.get('worker', float('nan')):.0f}",
            f"{d.cpu.get('bench', float('nan')):.0f}",
            f"{d.cpu.get('machine', float('nan')):.0f}",
        )
        for d in drains
    ]
    print(
        f"\nP3: {args.p3_conversations} conversations over budget at once, one worker"
        f" (max_concurrent_compactions {args.p3_concurrency or 'default'},"
        f" pool_max_size {args.p3_pool or 'default'}):\n"
        + table(
            (
                "LLM ms",
                "n",
                "drain s",
                "last command s",
                "compactions/s",
                "p50 ms",
                "p99 ms",
                "peak in flight",
                "peak LLM",
                "LLM calls/compaction",
                "worker CPU %",
                "bench CPU %",
                "machine busy %",
            ),
            rows,
        )
    )
    print(
        "drain: first over-budget event produced → last clip-archive consumed; last command:"
        " → last compaction command seen on its topic;\nworker CPU: % of one core (process"
        " tree) over the drain; bench CPU: this process (LLM test server, producer, consumers);"
        "\nmachine busy: % of all cores, whoever used them (PostgreSQL, the broker, other"
        " sessions)."
    )


async def compaction_cpu(args: argparse.Namespace, infra: Infra) -> tuple[int, float, float]:
    """CPU per compaction without Kafka: ``Processor.compact`` (the worker's own
    code: reads, compress, commit, relay to a recording publisher) for
    ``--cpu-compactions`` conversations, ``--cpu-concurrency`` at a time, against
    real PostgreSQL and the LLM test server at 0 ms, both in this process.

    Returns (compactions, wall seconds, CPU seconds of this process). CPU time,
    unlike the drain rate, hardly moves with what else the machine runs.
    """
    from streams.metrics import Metrics
    from streams.worker.outbox import OutboxRelay
    from streams.worker.processor import Compacted, Processor
    from streams.worker.runtime import StaticRuntime
    from tests.support.memory_store import RecordingPublisher

    server = LLMTestServer(responder=model_like_responder)  # summaries the gate passes
    await server.start()
    budget = BudgetConfig(context_budget=BUDGET[0], model_max_tokens=BUDGET[1])
    model, store, compactor = await bench_compactor(infra, server.openai_base_url, budget)
    publisher, metrics = RecordingPublisher(), Metrics()
    resources = StaticRuntime(store, compactor)
    relay = OutboxRelay(resources, publisher, metrics, grace_seconds=30.0)
    processor = Processor(
        runtime=resources, publisher=publisher, relay=relay, metrics=metrics, budget=budget
    )
    conversations = [f"cpu-{i:05d}" for i in range(args.cpu_compactions)]
    try:
        for c in conversations:
            for event in [*prefill_events(c, args.messages), over_budget_event(c, args.messages)]:
                await saved(store, event.to_message(), event.token_count or 0)
        slots = asyncio.Semaphore(args.cpu_concurrency)

        async def one(conversation_id: str) -> None:
            async with slots:
                command = CompactionCommand(
                    compaction_id=compaction_id_for(conversation_id, 0),
                    conversation_id=conversation_id,
                    generation=0,
                    issued_at=datetime.now(UTC),
                )
                outcome = await processor.compact(command)
                if not isinstance(outcome, Compacted):
                    raise RuntimeError(f"{conversation_id}: {outcome}")

        note(f"CPU: {len(conversations)} compactions in this process")
        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(c) for c in conversations))
        return len(conversations), time.perf_counter() - started, time.process_time() - cpu
    finally:
        await store.close()
        await close_model(model)
        await server.close()


def report_cpu(result: tuple[int, float, float], args: argparse.Namespace) -> None:
    count, wall, cpu = result
    print(
        "\nCPU per compaction in-process (Processor.compact, real PostgreSQL, LLM test server"
        " at 0 ms in this process, recording publisher, no Kafka):\n"
        + table(
            ("n", "concurrency", "wall s", "compactions/s", "CPU ms/compaction"),
            [
                (
                    count,
                    args.cpu_concurrency,
                    f"{wall:.2f}",
                    f"{count / wall:.1f}",
                    f"{cpu * 1000 / count:.2f}",
                )
            ],
        )
    )
    print("CPU: this process (the worker's code and the LLM test server), not PostgreSQL's.")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def report(phases: list[Phase], directs: list[Phase]) -> None:
    direct_of = {(d.concurrency, d.latency_ms): statistics.median(d.latencies) for d in directs}
    rows = []
    for p in phases:
        direct = direct_of[(p.concurrency, p.latency_ms)]
        ideal = f"{len(p.latencies) / p.ideal_seconds:.1f}" if p.ideal_seconds else "-"
        rows.append(
            (
                p.concurrency,
                f"{p.latency_ms:g}",
                p.name,
                len(p.latencies),
                ms(direct),
                ms(percentile(p.latencies, 50)),
                ms(percentile(p.latencies, 95)),
                ms(percentile(p.latencies, 99)),
                ms(max(p.latencies)),
                f"{percentile(p.latencies, 50) / direct:.1f}",
                f"{statistics.mean(p.latencies) * 1000:.0f}",
                ms(statistics.mean(p.to_command)) if p.to_command else "-",
                "-" if p.worker_mean is None else ms(p.worker_mean),
                f"{p.throughput:.1f}",
                ideal,
                f"{p.peak_in_flight:.0f}" if p.peak_in_flight is not None else "-",
                p.peak_llm if p.peak_llm is not None else "-",
                f"{(p.llm_calls or 0) / len(p.latencies):.2f}",
                f"{p.cpu.get('worker', float('nan')):.0f}",
                f"{p.cpu.get('machine', float('nan')):.0f}",
            )
        )
    print(
        table(
            (
                "max_concurrent",
                "LLM ms",
                "phase",
                "n",
                "direct p50 ms",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "max ms",
                "p50 ÷ direct",
                "mean ms",
                "to command mean ms",
                "worker mean ms",
                "compactions/s",
                "ideal/s",
                "peak in flight",
                "peak LLM",
                "LLM calls/compaction",
                "worker CPU %",
                "machine busy %",
            ),
            rows,
        )
    )
    print(
        "\nlatency: over-budget message event produced → its clip-archive event consumed;"
        "\nto command: the same event produced → its compaction command seen on the commands"
        " topic (the accounting agent's part);"
        "\nworker mean: the worker's compactor_compaction_latency_seconds (command issued →"
        " events published) over the phase."
        "\ndirect: load_history + plan in this process (no Kafka, no worker), median of"
        " the direct runs; ideal/s: n compactions in ceil(n ÷ max_concurrent) rounds of one\n"
        " direct p50 each (burst only);\nworker CPU: % of one core over the phase;"
        " machine busy: % of all cores, whoever used them (other sessions too)."
    )


def report_stages(phases: list[Phase], directs: list[Phase], hops: list[float]) -> None:
    direct_of = {(d.concurrency, d.latency_ms): statistics.median(d.latencies) for d in directs}
    rows = []
    for p in phases:
        means = [statistics.mean(stage[i] for stage in p.stages) for i in range(4)]
        rows.append(
            (
                p.concurrency,
                f"{p.latency_ms:g}",
                p.name,
                *(ms(m) for m in means),
                ms(sum(means)),
                ms(direct_of[(p.concurrency, p.latency_ms)]),
            )
        )
    print(
        "\nwhere the time goes (means, ms; wall clocks of this machine):\n"
        + table(
            (
                "max_concurrent",
                "LLM ms",
                "phase",
                "accounting",
                "command→archive built",
                "commit+relay",
                "to consumer",
                "total",
                "direct p50",
            ),
            rows,
        )
    )
    print(
        "accounting: event produced → command issued_at (the agent: consume, save, tally,"
        " last_seq);\ncommand→archive built: issued_at → the clip-archive event's created_at"
        " (command produce + ack, processor fetch, scheduler queue, checks, load_history, LLM"
        " calls, plan; set inside the compaction transaction);\ncommit+relay: created_at → the"
        " clip-archive record's timestamp (commit, pending_outbox, send);\nto consumer: record"
        " timestamp → consumed by this process."
    )
    print(
        "Kafka hop (plain aiokafka, produce with acks=all → consume, median of 20, once per"
        " worker): " + ", ".join(f"{ms(h)} ms" for h in hops)
    )


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def to_json(
    args: argparse.Namespace,
    phases: list[Phase] | None,
    drains: list[Drain] | None,
    cpu: tuple[int, float, float] | None,
) -> dict[str, Any]:
    """Every figure of the printed tables that bench.plot draws, plus the run's identity."""
    latency = [
        {
            "max_concurrent": p.concurrency,
            "llm_ms": p.latency_ms,
            "phase": p.name,
            "n": len(p.latencies),
            "p50_ms": percentile(p.latencies, 50) * 1000,
            "p95_ms": percentile(p.latencies, 95) * 1000,
            "compactions_per_s": _finite(p.throughput),
            "peak_in_flight": p.peak_in_flight,
            "worker_cpu_percent": _finite(p.cpu.get("worker")),
            "machine_busy_percent": _finite(p.cpu.get("machine")),
        }
        for p in phases or []
    ]
    p3 = [
        {
            "conversations": d.conversations,
            "llm_ms": d.latency_ms,
            "drain_s": d.seconds,
            "rate_per_s": _finite(d.rate),
            "peak_in_flight": d.peak_in_flight,
            "peak_llm": d.peak_llm,
            "p50_ms": percentile(d.latencies, 50) * 1000 if d.latencies else None,
            "p99_ms": percentile(d.latencies, 99) * 1000 if d.latencies else None,
            "machine_busy_percent": _finite(d.cpu.get("machine")),
        }
        for d in drains or []
    ]
    out: dict[str, Any] = {
        "bench": "compaction_latency",
        "command": shlex.join(["python", "-m", "bench.compaction_latency", *sys.argv[1:]]),
        "cpus": os.cpu_count(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "store": args.store,
        "latency": latency,
        "p3": p3,
    }
    if cpu is not None:
        count, wall, cpu_seconds = cpu
        out["cpu"] = {
            "n": count,
            "concurrency": args.cpu_concurrency,
            "wall_s": wall,
            "compactions_per_s": count / wall if wall else None,
            "cpu_ms_per_compaction": cpu_seconds * 1000 / count if count else None,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compaction_latency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--conversations", type=int, default=40, help="burst size M")
    parser.add_argument("--serial", type=int, default=5, help="conversations one at a time")
    parser.add_argument("--direct", type=int, default=5, help="direct compactions (baseline)")
    parser.add_argument(
        "--messages", type=int, default=20, help="messages before the over-budget one"
    )
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 500.0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--store", choices=["rocksdb://", "memory://"], default="rocksdb://")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per phase")
    parser.add_argument(
        "--scenario",
        choices=["all", "p2", "p3", "cpu"],
        default="all",
        help="p2: serial/burst tables; p3: a thousand at once; cpu: CPU per compaction in-process",
    )
    parser.add_argument("--cpu-compactions", type=int, default=400)
    parser.add_argument("--cpu-concurrency", type=int, default=16)
    parser.add_argument("--p3-conversations", type=int, default=1000, help="P3 drain size")
    parser.add_argument("--p3-latency-ms", type=float, nargs="+", default=[500.0, 0.0])
    parser.add_argument(
        "--p3-concurrency",
        type=int,
        default=None,
        help="P3 max_concurrent_compactions (default: shipped)",
    )
    parser.add_argument(
        "--p3-pool", type=int, default=None, help="P3 [postgres].pool_max_size (default: shipped)"
    )
    parser.add_argument("--json", default=None, metavar="FILE", help="also write JSON here")
    parser.add_argument("--py-spy", default=None, help="record the P3 worker to FILE.<ms>ms.txt")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="8 conversations, 2 serial, 200 ms, concurrency 4; P3 with 100 conversations",
    )
    args = parser.parse_args()
    if args.quick:  # smaller defaults; options given explicitly still win
        parser.set_defaults(
            conversations=8,
            serial=2,
            direct=2,
            latency_ms=[0.0, 200.0],
            concurrency=[4],
            p3_conversations=100,
            cpu_compactions=100,
        )
        args = parser.parse_args()
    print_header("compaction latency", "bench.compaction_latency")
    phases: list[Phase] | None = None
    drains: list[Drain] | None = None
    cpu: tuple[int, float, float] | None = None
    with Infra(partitions=args.partitions) as infra:
        print(infra.describe())
        print(
            f"workload: per latency, {args.serial} serial + {args.conversations} burst "
            f"conversations of {args.messages} × {SMALL_TOKENS} tokens, then one of "
            f"{BIG_TOKENS} (budget {int(BUDGET[0] * BUDGET[1])}); store {args.store}\n"
        )
        if args.scenario in ("all", "p2"):
            phases, directs, hops = asyncio.run(run(args, infra))
        if args.scenario in ("all", "p3"):
            drains = asyncio.run(run_p3(args, infra))
        if args.scenario in ("all", "cpu"):
            cpu = asyncio.run(compaction_cpu(args, infra))
    if phases is not None:
        report(phases, directs)
        report_stages(phases, directs, hops)
    if drains is not None:
        report_p3(drains, args)
    if cpu is not None:
        report_cpu(cpu, args)
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(args, phases, drains, cpu), indent=2) + "\n")
        note(f"wrote {args.json}")


if __name__ == "__main__":
    main()
