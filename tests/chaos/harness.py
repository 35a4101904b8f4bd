"""The fault-injection harness: one scenario's slice of the system, a supervisor,
a producer that outlives broker restarts, and the scenario's result line.

A ``ChaosStack`` is like the end-to-end ``Stack`` (own topic prefix, app id
and database; real worker processes) with what faults need on top:

* workers that can be SIGKILLed and are restarted by a supervisor loop, the
  way systemd or Kubernetes would; a worker that exits without being killed
  is restarted too, but recorded (it needed a restart nobody asked for);
* a producer that retries until the broker acknowledges, so "produced" means
  acknowledged even across a broker crash, and paced replay of a workload;
* an ``OffsetWatch`` sampling every second, from ``open`` to the end, that
  no committed offset of the messages topic is ahead of PostgreSQL;
* ``settle``: from the end of the faults, poll every invariant
  (``tests/chaos/invariants.py``) until all hold, giving the time to recover;
* ``finish``: print the summary line, append it as JSON to ``$CHAOS_RESULTS``,
  and fail with every violation, diagnosed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from core.settings import default_min_insync
from streams.topics import TopicNames
from tests.chaos.invariants import (
    InvariantContext,
    InvariantReport,
    MalformedRecord,
    OffsetWatch,
    ProducedMessage,
    check_invariants,
    clip_archive_copies,
)
from tests.chaos.kafka_tools import ChaosProducer, create_topics
from tests.chaos.workload import Conversation
from tests.support.chaos_llm import ChaosLLMServer
from tests.support.llm_server import ChatRequest, turn_words
from tests.support.metrics_text import metric
from tests.support.worker import REPO_ROOT, WorkerProcess, terminate_all

PARTITIONS = 6
BUDGET_TOKENS = 1000  # [budget] context_budget 0.5 x model_max_tokens 2000
RECOVERY_LIMIT_SECONDS = 60.0  # every invariant true within this of the fault's end
# Below this many compactions a duplicate rate is noise (one copy of 30 is 3 %).
MIN_COMPACTIONS_FOR_A_RATE = 200
# After the limit, polling goes on this much longer, only to tell "recovered
# late, after N s" from "never recovered" in the report.
RECOVERY_GRACE_SECONDS = 60.0
RESTART_DELAY_SECONDS = 1.0  # the supervisor's RestartSec
BIG_MESSAGE_BYTES = 8 * 1024 * 1024  # messages topic max.message.bytes in the malformed scenario


# --------------------------------------------------------------------------- scale


@dataclass(frozen=True)
class Scale:
    name: str
    conversations: int
    kills: int
    rebalances: int
    storm_seconds: float
    pg_outages: int
    broker_outages: int
    malformed_copies: int  # of each malformed kind
    big_records: int  # multi-megabyte records
    leader_kills: int  # per cluster scenario phase: SIGKILLs of a partition leader
    rolling_rounds: int  # rolling restarts of the whole cluster
    node_down_seconds: float  # how long one node of the cluster stays down
    upgrade_replay_seconds: float  # the replay the rolling upgrade runs under
    timeout: float  # per test, seconds


FULL = Scale(
    name="full",
    conversations=500,
    kills=10,
    rebalances=10,
    storm_seconds=60.0,
    pg_outages=3,
    broker_outages=3,
    malformed_copies=3,
    big_records=4,
    leader_kills=6,
    rolling_rounds=2,
    node_down_seconds=180.0,
    upgrade_replay_seconds=240.0,
    timeout=1500.0,
)
SMALL = Scale(
    name="small",
    conversations=60,
    kills=3,
    rebalances=3,
    storm_seconds=15.0,
    pg_outages=1,
    broker_outages=1,
    malformed_copies=1,
    big_records=2,
    leader_kills=1,
    rolling_rounds=1,
    node_down_seconds=20.0,
    upgrade_replay_seconds=75.0,
    timeout=420.0,
)


def selected_scale() -> Scale:
    """``$CHAOS_SCALE``: ``small`` (CI) or ``full`` (the default with ``-m chaos``)."""
    name = os.environ.get("CHAOS_SCALE", "full").strip().lower() or "full"
    scales = {"full": FULL, "small": SMALL}
    if name not in scales:
        raise ValueError(f"CHAOS_SCALE={name!r}: use one of {sorted(scales)}")
    return scales[name]


SCALE = selected_scale()

# make_stack(scenario, bootstrap, dsn, *, max_message_bytes=None, extra_logs=None)
MakeStack = Callable[..., Awaitable["ChaosStack"]]

# Summary lines of this session, printed again at the end of the run.
RESULTS: list[str] = []


def short_summary(request: ChatRequest) -> str:
    """Summaries stay short, so clip-archives never push a conversation over budget."""
    return f"Summary: {len(request.messages)} messages about {turn_words(request)}."


# --------------------------------------------------------------------------- workers


class ChaosWorker(WorkerProcess):
    """A worker the supervisor keeps running while ``expected_alive``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.expected_alive = True
        self.killed_by_test = False
        self.kills = 0
        self.restarts = 0
        self.unexpected_exits: list[str] = []

    def restart(self) -> ChaosWorker:
        if self.alive:
            raise RuntimeError(f"worker {self.name} is running")
        with self.log_path.open("a", encoding="utf-8") as log:
            log.write(f"\n=== chaos supervisor: restart #{self.restarts + 1} ===\n")
        self.process = None
        self.restarts += 1
        self.start()
        return self

    def sigkill(self) -> None:
        self.killed_by_test = True
        self.kills += 1
        self.kill()

    async def in_flight(self) -> float:
        """Compactions running in this worker now (0 if it does not answer)."""
        try:
            return metric(await self.metrics_text(), "compactor_compactions_in_flight")
        except Exception:
            return 0.0


# --------------------------------------------------------------------------- the stack


@dataclass
class Outcome:
    scenario: str
    report: InvariantReport
    recovered_after: float | None  # seconds from the fault's end to all invariants true
    history: list[str] = field(default_factory=list)


class ChaosStack:
    def __init__(
        self,
        *,
        scenario: str,
        bootstrap: str,
        dsn: str,
        llm: ChaosLLMServer,
        root: Path,
        scale: Scale = SCALE,
        seed: int = 0,
        replication: int = 1,
    ) -> None:
        tag = uuid.uuid4().hex[:8]
        self.scenario = scenario
        self.replication = replication
        self.bootstrap = bootstrap
        self.dsn = dsn
        self.llm = llm
        self.root = root
        self.scale = scale
        self.rng = random.Random(seed)
        self.prefix = f"chaos.{tag}."
        self.app_id = f"chaos-{tag}"
        self.names = TopicNames.with_prefix(self.prefix)
        self.workers: list[ChaosWorker] = []
        self.producer = ChaosProducer(bootstrap)
        self.pool: asyncpg.Pool | None = None
        self.produced: dict[str, ProducedMessage] = {}
        self.conversations: dict[str, list[dict[str, Any]]] = {}
        self.malformed: list[MalformedRecord] = []
        self.faults: Counter[str] = Counter()
        self.notes: dict[str, Any] = {}
        self.extra_logs: list[tuple[str, Path]] = []
        self.started_at = time.monotonic()
        self._supervisor: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._worker_config: dict[str, dict[str, Any]] = {}
        self.offsets = OffsetWatch(bootstrap, self.app_id, self.names.messages, PARTITIONS)

    # -- lifecycle ------------------------------------------------------------

    async def open(self, max_message_bytes: int | None = None) -> None:
        """Create the topics; ``max_message_bytes`` raises the messages topic's
        ``max.message.bytes`` so the broker accepts multi-megabyte records."""
        configs = (
            {self.names.messages: {"max.message.bytes": str(max_message_bytes)}}
            if max_message_bytes
            else {}
        )
        await create_topics(
            self.bootstrap, self.names, PARTITIONS, configs, replication=self.replication
        )
        await self.producer.start()
        self.pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=4)
        self._supervisor = asyncio.create_task(self._supervise())
        self._watcher = asyncio.create_task(self._watch_offsets())

    async def close(self) -> None:
        for task in (self._supervisor, self._watcher):
            if task is None:
                continue
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.to_thread(terminate_all, list(self.workers))
        await self.producer.stop()
        if self.pool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.pool.close(), 10)

    @property
    def db(self) -> asyncpg.Pool:
        assert self.pool is not None
        return self.pool

    # -- workers ----------------------------------------------------------------

    def config(self) -> dict[str, dict[str, Any]]:
        return {
            "summarization": {
                "provider": "openai",
                "base_url": self.llm.openai_base_url,
                "model": "test-model",
                "chunk_size": 10,
                "min_chunk_tokens": 0,  # chunks of chunk_size turns, however short
                "keep_recent": 6,
                "max_summary_tokens": 200,
                "timeout_seconds": 5.0,
                "max_retries": 2,
                "retry_backoff_seconds": 0.2,
                "max_consecutive_failures": 10,
                "circuit_cooldown_seconds": 2.0,
            },
            "budget": {"context_budget": 0.5, "model_max_tokens": 2000},
            "postgres": {"pool_min_size": 1, "pool_max_size": 4},
            "kafka": {
                "topic_prefix": self.prefix,
                "partitions": PARTITIONS,
                "replication_factor": self.replication,
                "min_insync_replicas": default_min_insync(self.replication),
                # The invariants compare dead letters with the bytes sent.
                "dead_letter_content": "full",
                # A killed worker's partitions move after 6 s, not Faust's 60.
                "session_timeout_seconds": 6.0,
                "heartbeat_interval_seconds": 1.0,
            },
            "service": {
                "app_id": self.app_id,
                "store": "memory://",
                "max_concurrent_compactions": 8,
                "command_timeout_seconds": 15.0,
                "reconcile_interval_seconds": 1.0,
                "outbox_relay_interval_seconds": 1.0,
            },
        }

    def configure(self, overrides: Mapping[str, Mapping[str, Any]]) -> None:
        """Overrides for every worker started from now on."""
        for section, values in overrides.items():
            self._worker_config.setdefault(section, {}).update(values)

    def worker(
        self,
        name: str,
        *,
        code_root: Path = REPO_ROOT,
        omit: Mapping[str, Sequence[str]] | None = None,
    ) -> ChaosWorker:
        """Start a worker of this checkout, or of ``code_root`` (another release's
        tree); ``omit`` drops config keys that release does not know."""
        sections = self.config()
        for section, values in self._worker_config.items():
            sections.setdefault(section, {}).update(values)
        for section, keys in (omit or {}).items():
            for key in keys:
                sections.get(section, {}).pop(key, None)
        worker = ChaosWorker(
            self.root,
            name,
            bootstrap=self.bootstrap,
            dsn=self.dsn,
            config=sections,
            code_root=code_root,
        )
        self.workers.append(worker)
        worker.start()
        return worker

    @property
    def expected(self) -> list[ChaosWorker]:
        return [w for w in self.workers if w.expected_alive]

    async def _watch_offsets(self) -> None:
        """``OffsetWatch`` every second while the scenario runs (invariants.py)."""
        while True:
            if self.pool is not None:
                await self.offsets.sample(self.pool, self.produced)
            await asyncio.sleep(1.0)

    async def _supervise(self) -> None:
        """Restart whatever should run and does not, as a process supervisor would."""
        while True:
            for worker in self.expected:
                if not worker.expected_alive or worker.alive or worker.process is None:
                    continue
                if not worker.killed_by_test:
                    code = worker.process.poll()
                    worker.unexpected_exits.append(
                        f"{worker.name} exited by itself with code {code} at "
                        f"t={time.monotonic() - self.started_at:.1f}s; log tail:\n"
                        + worker.log_tail(30)
                    )
                    self.faults["unexpected_worker_exits"] += 1
                await asyncio.sleep(RESTART_DELAY_SECONDS)
                worker.killed_by_test = False
                if worker.expected_alive and not worker.alive:
                    worker.restart()
            await asyncio.sleep(0.2)

    async def wait_for_group(self, timeout: float = 90.0) -> list[set[int]]:
        """Until the expected workers own the messages partitions, disjointly, covering all."""
        topic = self.names.messages
        deadline = time.monotonic() + timeout
        last: list[set[int] | None] = []
        while True:
            workers = self.expected
            last = [await w.assigned(topic) if w.alive else None for w in workers]
            owned = [p for p in last if p]
            if len(owned) == len(workers):
                union: set[int] = set().union(*owned)
                if sum(map(len, owned)) == len(union) and union == set(range(PARTITIONS)):
                    return owned
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {w.name}\n{w.log_tail(25)}" for w in workers)
                raise AssertionError(
                    f"partitions never split across {[w.name for w in workers]}: {last}\n{tails}"
                )
            await asyncio.sleep(0.25)

    async def total_in_flight(self) -> float:
        return sum([await w.in_flight() for w in self.workers if w.alive])

    # -- producing --------------------------------------------------------------

    def add_conversations(self, conversations: Sequence[Conversation]) -> None:
        for conversation in conversations:
            self.conversations.setdefault(conversation.id, []).extend(conversation.events)

    async def send_messages(self, events: Sequence[Mapping[str, Any]]) -> None:
        records = [(str(e["conversation_id"]).encode(), json.dumps(e).encode()) for e in events]
        placed = await self.producer.send_many(self.names.messages, records)
        for event, (partition, offset) in zip(events, placed, strict=True):
            message_id = str(event["message_id"])
            self.produced[message_id] = ProducedMessage(
                message_id=message_id,
                conversation_id=str(event["conversation_id"]),
                partition=partition,
                offset=offset,
            )

    async def replay(self, events: Sequence[Mapping[str, Any]], seconds: float) -> None:
        """Produce ``events`` in order, spread evenly over ``seconds``."""
        start = time.monotonic()
        step = max(1, len(events) // max(1, int(seconds * 5)))  # about five sends a second
        for i in range(0, len(events), step):
            due = start + seconds * i / max(1, len(events))
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # pacing the traffic, not waiting for a state
            await self.send_messages(events[i : i + step])

    async def send_malformed(
        self, key: bytes | None, value: bytes, error_types: tuple[str, ...], what: str
    ) -> None:
        partition, offset = await self.producer.send(self.names.messages, value, key)
        self.malformed.append(
            MalformedRecord(
                what=what,
                partition=partition,
                offset=offset,
                key=key,
                value=value,
                error_types=error_types,
            )
        )

    # -- checking ---------------------------------------------------------------

    def context(self, sample: int = 200) -> InvariantContext:
        return InvariantContext(
            db=self.db,
            bootstrap=self.bootstrap,
            names=self.names,
            partitions=PARTITIONS,
            group=self.app_id,
            produced=self.produced,
            conversations=self.conversations,
            malformed=self.malformed,
            workers=self.expected,
            budget_tokens=BUDGET_TOKENS,
            table_sample=sample,
            rng_seed=0,
            offset_watch=self.offsets,
        )

    async def settle(self, fault_end: float) -> Outcome:
        """Poll every invariant from ``fault_end`` until all hold (or limit + grace)."""
        give_up = fault_end + RECOVERY_LIMIT_SECONDS + RECOVERY_GRACE_SECONDS
        recovered_after: float | None = None
        last_violated: dict[str, float] = {}
        while True:
            report = await check_invariants(self.context())
            for name, count in report.counts().items():
                if count or report.violations[name]:
                    last_violated[name] = round(time.monotonic() - fault_end, 1)
            # Which invariant held recovery up, and until when (seconds after the fault).
            self.notes["last_violated_after_fault"] = dict(last_violated)
            if report.ok:
                recovered_after = time.monotonic() - fault_end
                break
            if time.monotonic() > give_up:
                break
            await asyncio.sleep(1.0)
        history = [line for w in self.workers for line in w.unexpected_exits]
        return Outcome(self.scenario, report, recovered_after, history)

    async def finish(
        self,
        fault_end: float,
        *,
        fault_window: float,
        checks: Sequence[tuple[bool, str]] = (),
        max_duplicate_rate: float | None = None,
    ) -> None:
        """Settle, report the figures, and fail with every violation found.

        ``checks`` are the scenario's own (did the faults happen as planned?).
        ``max_duplicate_rate``: the most extra clip-archive copies per committed
        compaction the scenario allows (always reported; bounded once there are
        enough compactions for a rate to mean something)."""
        outcome = await self.settle(fault_end)
        copies = await clip_archive_copies(self.context())
        self.notes["clip_archive_events"] = copies.events
        self.notes["compactions_committed"] = copies.committed
        self.notes["duplicate_clip_archive_rate"] = round(copies.rate, 4)
        if (
            max_duplicate_rate is not None
            and copies.committed >= MIN_COMPACTIONS_FOR_A_RATE
            and copies.rate > max_duplicate_rate
        ):
            checks = [
                *checks,
                (
                    False,
                    f"{copies.extra} duplicate clip-archive events for {copies.committed} "
                    f"compactions ({copies.rate:.1%}, limit {max_duplicate_rate:.0%})",
                ),
            ]
        late = outcome.recovered_after is not None and (
            outcome.recovered_after > RECOVERY_LIMIT_SECONDS
        )
        problems: list[str] = []
        if not outcome.report.ok:
            problems.append(
                f"invariants still violated {RECOVERY_LIMIT_SECONDS + RECOVERY_GRACE_SECONDS:.0f}s "
                f"after the fault ended:\n{outcome.report.describe()}"
            )
        elif late:
            problems.append(
                f"recovered only {outcome.recovered_after:.1f}s after the fault ended "
                f"(limit {RECOVERY_LIMIT_SECONDS:.0f}s)"
            )
        if outcome.history:
            problems.append(
                "workers exited without being killed (they needed a restart):\n"
                + "\n".join(outcome.history)
            )
        problems.extend(f"fault injection: {text}" for ok, text in checks if not ok)
        self.record(outcome, fault_window, passed=not problems)
        if problems:
            raise AssertionError(f"[{self.scenario}] " + "\n\n".join(problems))

    def record(self, outcome: Outcome, fault_window: float, *, passed: bool) -> None:
        recovered = outcome.recovered_after
        result = {
            "scenario": self.scenario,
            "scale": self.scale.name,
            "passed": passed,
            "conversations": len(self.conversations),
            "events_produced": len(self.produced) + len(self.malformed),
            "valid_messages": len(self.produced),
            "malformed_records": len(self.malformed),
            "faults": dict(self.faults),
            "fault_window_seconds": round(fault_window, 1),
            "time_to_recover_seconds": None if recovered is None else round(recovered, 1),
            "recovery_limit_seconds": RECOVERY_LIMIT_SECONDS,
            "violations": outcome.report.counts(),
            "producer_retries": self.producer.retries,
            "worker_restarts": sum(w.restarts for w in self.workers),
            "offset_samples": self.offsets.samples,
            "offset_samples_skipped": self.offsets.skipped,
            "duration_seconds": round(time.monotonic() - self.started_at, 1),
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            **self.notes,
        }
        violated = ",".join(f"{k}={v}" for k, v in result["violations"].items() if v) or "none"
        line = (
            f"CHAOS {self.scenario} [{self.scale.name}] {'PASS' if passed else 'FAIL'}: "
            f"{result['events_produced']} events ({len(self.conversations)} conversations), "
            f"faults {dict(self.faults)}, window {fault_window:.0f}s, "
            f"recovered {'never' if recovered is None else f'{recovered:.1f}s'} after, "
            f"violations {violated}, "
            f"clip-archive copies {self.notes.get('clip_archive_events')} for "
            f"{self.notes.get('compactions_committed')} compactions"
        )
        print(line)
        RESULTS.append(line)
        path = os.environ.get("CHAOS_RESULTS")
        if path:
            with Path(path).open("a", encoding="utf-8") as out:
                out.write(json.dumps(result) + "\n")


# --------------------------------------------------------------------------- waiting


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], *, timeout: float, what: str, interval: float = 0.2
) -> float:
    """Until ``predicate()`` is true; the seconds it took. AssertionError on timeout."""
    start = time.monotonic()
    while not await predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not true within {timeout:.0f}s")
        await asyncio.sleep(interval)
    return time.monotonic() - start


async def at(moment: float) -> None:
    """Pause until the monotonic clock reads ``moment``: the fault schedule, not a wait
    for a state (those use ``wait_until``)."""
    delay = moment - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
