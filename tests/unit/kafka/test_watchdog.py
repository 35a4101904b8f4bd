"""The watchdog against a fake Faust app: stalls are healed, then escalated.

Why: a rebalance once left a worker in table recovery for over a minute (a
fetch in flight swallowed the changelog records recovery waited for), and
nothing noticed; the worker must never need a human to get going again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from faust.types import TP

from streams.kafka.watchdog import StallTracker, Watchdog, WatchdogLimits, WorkerStuckError
from streams.metrics import Metrics
from streams.worker.health import Health, Problem
from tests.support.metrics_text import sample

pytestmark = pytest.mark.unit

CHANGELOG = TP("app-conversations-changelog", 3)
MESSAGES = TP("t.messages", 1)
COMMANDS = TP("t.compaction-commands", 1)


@dataclass
class FakeConsumer:
    assigned: set[TP] = field(default_factory=set)
    highwaters: dict[TP, int] = field(default_factory=dict)
    _read_offset: dict[TP, int] = field(default_factory=dict)
    _committed_offset: dict[TP, int] = field(default_factory=dict)
    resumed: list[set[TP]] = field(default_factory=list)
    seeks: list[dict[TP, int]] = field(default_factory=list)
    fetch_buffer: dict[TP, Any] = field(default_factory=dict)  # aiokafka's fetched records
    _active_partitions: set[TP] | None = None

    def assignment(self) -> set[TP]:
        return self.assigned

    def highwater(self, tp: TP) -> int | None:
        return self.highwaters.get(tp)

    def resume_partitions(self, tps: set[TP]) -> None:
        # As Faust's: its active set takes them as given, and its next fetch
        # asserts every one is a faust TP (the worker crashes if not).
        assert all(isinstance(tp, TP) for tp in tps), f"not faust TPs: {tps}"
        self.resumed.append(set(tps))

    async def seek_to_committed(self) -> dict[TP, int]:
        raise AssertionError("Faust's seek_to_committed seeks every assigned partition back")

    @property
    def _thread(self) -> FakeConsumerThread:
        return FakeConsumerThread(self)

    async def seek_wait(self, offsets: dict[TP, int]) -> None:
        self.seeks.append(dict(offsets))


@dataclass
class FakeConsumerThread:
    """Faust's aiokafka thread: ``committed`` reads one partition's offset."""

    consumer: FakeConsumer

    def _ensure_consumer(self) -> FakeConsumerThread:
        return self

    @property
    def _fetcher(self) -> SimpleNamespace:
        return SimpleNamespace(_records=self.consumer.fetch_buffer)

    async def committed(self, tp: TP) -> int | None:
        return self.consumer._committed_offset.get(tp)

    async def call_thread(self, method: Any, *args: Any) -> Any:
        return await method(*args)


@dataclass
class FakeRecovery:
    in_recovery: bool = False
    active_offsets: dict[TP, int] = field(default_factory=dict)
    remaining: dict[TP, int] = field(default_factory=dict)

    def active_remaining(self) -> dict[TP, int]:
        return dict(self.remaining)


@dataclass
class FakeTables:
    recovery: FakeRecovery = field(default_factory=FakeRecovery)


@dataclass
class FakeApp:
    consumer: FakeConsumer = field(default_factory=FakeConsumer)
    tables: FakeTables = field(default_factory=FakeTables)
    consumer_generation_id: int = 2
    rebalancing: bool = False


@dataclass
class Rig:
    app: FakeApp
    health: Health
    metrics: Metrics
    watchdog: Watchdog
    crashes: list[BaseException]
    now: list[float]

    async def at(self, seconds: float) -> None:
        self.now[0] = seconds
        await self.watchdog.tick()


def rig() -> Rig:
    app = FakeApp()
    now = [0.0]
    health = Health(lambda: now[0])
    metrics = Metrics()
    crashes: list[BaseException] = []

    async def crash(reason: BaseException) -> None:
        crashes.append(reason)

    watchdog = Watchdog(
        lambda: app,
        health=health,
        metrics=metrics,
        watched_topics={MESSAGES.topic},
        limits=WatchdogLimits(stall_seconds=30, heals_before_exit=3),
        clock=lambda: now[0],
        crash=crash,
    )
    return Rig(app, health, metrics, watchdog, crashes, now)


def stuck_recovery(r: Rig) -> None:
    r.app.consumer.assigned = {CHANGELOG, MESSAGES}
    r.app.rebalancing = True  # Faust clears it only once recovery is over
    recovery = r.app.tables.recovery
    recovery.in_recovery = True
    recovery.active_offsets = {CHANGELOG: -1}
    recovery.remaining = {CHANGELOG: 21}


async def test_a_stuck_table_recovery_is_resought_where_recovery_would_seek() -> None:
    r = rig()
    stuck_recovery(r)
    for t in (0, 10, 29):
        await r.at(t)
    assert r.app.consumer.seeks == []
    await r.at(31)
    assert r.app.consumer.resumed == [{CHANGELOG}]
    assert r.app.consumer.seeks == [{CHANGELOG: 0}]
    (problem,) = r.health.problems()
    assert problem.component == f"watchdog {CHANGELOG.topic}:3"
    assert "table recovery" in problem.detail
    assert sample(r.metrics, "compactor_watchdog_heals_total", what="table recovery") == 1
    r.app.tables.recovery.in_recovery = False  # the re-seek worked: recovery finished
    r.app.rebalancing = False
    await r.at(33)
    assert r.health.ok
    assert r.crashes == []


async def test_a_recovery_that_re_seeking_does_not_move_ends_the_worker() -> None:
    r = rig()
    stuck_recovery(r)
    for t in range(0, 200, 2):
        await r.at(t)
    assert len(r.app.consumer.seeks) == 3
    (reason,) = r.crashes[:1]
    assert isinstance(reason, WorkerStuckError)
    assert "after 3 re-seeks" in str(reason)
    assert sample(r.metrics, "compactor_watchdog_exits_total") >= 1


async def test_a_rebalance_restarts_the_clock() -> None:
    r = rig()
    stuck_recovery(r)
    await r.at(0)
    await r.at(25)
    r.app.consumer_generation_id += 1
    await r.at(40)
    assert r.app.consumer.seeks == []


async def test_recovery_that_moves_is_left_alone() -> None:
    r = rig()
    stuck_recovery(r)
    recovery = r.app.tables.recovery
    for t in range(0, 120, 5):
        recovery.active_offsets[CHANGELOG] = t  # slow but moving
        recovery.remaining[CHANGELOG] = 1000 - t
        await r.at(t)
    assert r.app.consumer.seeks == [] and r.health.ok


def reading(r: Rig, *, read: int, committed: int, highwater: int = 50) -> None:
    consumer = r.app.consumer
    consumer.assigned = {MESSAGES, COMMANDS}
    consumer.highwaters = {MESSAGES: highwater, COMMANDS: highwater}
    consumer._read_offset = {MESSAGES: read, COMMANDS: read}
    consumer._committed_offset = {MESSAGES: committed, COMMANDS: committed}


async def test_a_source_partition_that_stops_moving_is_resought_to_its_committed_offset() -> None:
    r = rig()
    reading(r, read=20, committed=12)
    await r.at(0)
    await r.at(31)
    assert r.app.consumer.seeks == [{MESSAGES: 12}]  # the commands topic is not watched
    # Faust's fetch loop drops records below its read offset: reset with the seek,
    # records 12..20 are read again (left at 20, none of them would be).
    assert r.app.consumer._read_offset[MESSAGES] == 12
    reading(r, read=25, committed=20)  # moving again
    await r.at(33)
    assert r.health.ok


async def test_no_re_seek_once_a_rebalance_began_during_the_pass() -> None:
    """A pass that looked before a rebalance must not re-seek after it: in the
    hour soak re-seeks 1 s into a new generation, while recovery sought the
    same partitions, came with three messages never stored."""
    r = rig()
    reading(r, read=20, committed=12)
    await r.at(0)
    real_reseek = r.watchdog._reseek
    r.app.consumer.assigned.add(TP(MESSAGES.topic, 2))
    r.app.consumer.highwaters[TP(MESSAGES.topic, 2)] = 50
    r.app.consumer._read_offset[TP(MESSAGES.topic, 2)] = 20
    r.app.consumer._committed_offset[TP(MESSAGES.topic, 2)] = 12
    r.watchdog._trackers["reading"].observe(2, {TP(MESSAGES.topic, 2): ((20, 12), 29)}, 0)

    async def reseek_then_rebalance(*args: object, **kwargs: object) -> None:
        await real_reseek(*args, **kwargs)  # type: ignore[arg-type]
        r.app.consumer_generation_id += 1  # the group rebalances meanwhile

    r.watchdog._reseek = reseek_then_rebalance  # type: ignore[method-assign]
    await r.at(31)
    assert len(r.app.consumer.seeks) == 1  # the second stalled partition waits


async def test_a_slow_agent_that_still_commits_is_not_a_stall() -> None:
    r = rig()
    for t in range(0, 120, 5):
        reading(r, read=40, committed=t // 5)  # buffer full, nothing read, commits advance
        await r.at(t)
    assert r.app.consumer.seeks == []


class FetchedRecords:
    """aiokafka's ``FetchResult``: records fetched, not yet handed out."""

    def has_more(self) -> bool:
        return True


async def test_a_partition_waiting_behind_a_backlog_is_not_a_stall() -> None:
    """aiokafka hands records out in the order it fetched them: under a backlog
    a control partition waited over 30 s behind the messages partitions, and
    three useless re-seeks ended the worker (the turn-read bench at 1,000
    events/s)."""
    r = rig()
    reading(r, read=20, committed=12)
    r.app.consumer.fetch_buffer = {MESSAGES: FetchedRecords()}
    r.app.consumer._active_partitions = {MESSAGES, COMMANDS}
    for t in range(0, 240, 2):
        r.app.consumer._read_offset[COMMANDS] = 100 + t  # the drain loop delivers others
        await r.at(t)
    assert r.app.consumer.seeks == [] and r.crashes == [] and r.health.ok


async def test_records_waiting_for_a_drain_loop_that_delivers_nothing_are_a_stall() -> None:
    r = rig()
    reading(r, read=20, committed=12)
    r.app.consumer.fetch_buffer = {MESSAGES: FetchedRecords()}
    for t in range(0, 32, 2):
        await r.at(t)  # nothing delivered anywhere: the drain loop itself is wedged
    assert r.app.consumer.seeks == [{MESSAGES: 12}]


async def test_records_fetched_for_a_paused_partition_are_a_stall() -> None:
    r = rig()
    reading(r, read=20, committed=12)
    r.app.consumer.fetch_buffer = {MESSAGES: FetchedRecords()}
    r.app.consumer._active_partitions = {COMMANDS}  # Faust never asks for MESSAGES
    for t in range(0, 32, 2):
        r.app.consumer._read_offset[COMMANDS] = 100 + t
        await r.at(t)
    assert r.app.consumer.seeks == [{MESSAGES: 12}]
    assert r.app.consumer.resumed == [{MESSAGES}]


@pytest.mark.parametrize(
    ("component", "detail"),
    [
        ("accounting", "outage on t.messages[1]@20"),
        ("runtime", "opening PostgreSQL: StoreUnavailable: refused"),  # still starting up
    ],
)
async def test_a_database_outage_explains_a_partition_that_does_not_move(
    component: str, detail: str
) -> None:
    r = rig()
    r.health.report(component, detail)
    reading(r, read=20, committed=12)
    for t in range(0, 120, 5):
        await r.at(t)
    assert r.app.consumer.seeks == []
    assert r.health.problems() == [Problem(component, detail, 0.0)]


async def test_a_caught_up_partition_is_never_stalled() -> None:
    r = rig()
    reading(r, read=49, committed=50, highwater=50)
    for t in range(0, 120, 5):
        await r.at(t)
    assert r.app.consumer.seeks == []


async def test_a_failing_look_does_not_raise() -> None:
    r = rig()
    r.app.tables = None  # type: ignore[assignment]
    r.app.consumer.assigned = {MESSAGES}
    await r.at(0)  # logged, not raised: an exception in a Faust timer stops the worker


def test_the_stall_tracker_forgets_partitions_that_leave() -> None:
    tracker = StallTracker(stall_seconds=10)
    assert tracker.observe(1, {"a": (5, 3), "b": (1, 0)}, 0) == []
    assert tracker.observe(1, {"a": (5, 3), "b": (1, 0)}, 10) == ["a"]  # b has nothing left
    assert tracker.observe(1, {}, 11) == []
    assert tracker.observe(1, {"a": (5, 3)}, 30) == []  # a new mark, not the old one
    tracker.restart("a", 35)
    assert tracker.observe(1, {"a": (5, 3)}, 44) == []
    assert tracker.observe(1, {"a": (5, 3)}, 45) == ["a"]


async def test_recovery_partitions_from_aiokafka_are_resumed_as_faust_tps() -> None:
    """Recovery's partitions are keys of aiokafka's end offsets (``TopicPartition``):
    handed to Faust's ``resume_partitions`` as they are, they crashed the worker
    at its next fetch (``isinstance(x, TP)``), every agent "crashed with
    CancelledError" on the way out (seen in the chaos re-seek scenario)."""
    r = rig()
    stuck_recovery(r)
    theirs = TopicPartition(CHANGELOG.topic, CHANGELOG.partition)
    recovery = r.app.tables.recovery
    recovery.active_offsets = {theirs: 7}  # type: ignore[dict-item]
    recovery.remaining = {theirs: 21}  # type: ignore[dict-item]
    await r.at(0)
    await r.at(31)
    assert r.app.consumer.resumed == [{CHANGELOG}]
    ((sought,),) = [list(seek) for seek in r.app.consumer.seeks]
    assert type(sought) is TP
    assert r.app.consumer.seeks == [{CHANGELOG: 7}]
