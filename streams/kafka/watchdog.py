"""A worker never stays stuck: table recovery and source partitions are watched.

Two ways a worker was seen or found to stop making progress with nothing in
its logs but a repeated warning:

* table recovery waits on a changelog partition whose records a fetch in
  flight across the rebalance swallowed (patched in ``faust_patches``; the
  watchdog is the net for causes not found yet);
* a source partition with records to read whose read position stops moving
  (but not one whose fetched records wait their turn behind a backlog while
  Faust delivers others: slow is not stuck).

``StallTracker`` (pure) says which partitions have made no progress for long
enough; ``Watchdog.tick`` (a timer) heals them the way recovery itself would
(resume and seek the partition), reports the problem in ``/healthz`` and a
metric, and when healing does not help, crashes the worker on purpose so its
supervisor starts a fresh one (exit status 1) instead of leaving it stuck.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from faust.types import TP

from streams.kafka.seeking import seek_to_reread
from streams.metrics import Metrics
from streams.worker.health import Health

log = logging.getLogger("compactor.worker")


#: Health components whose problem means "waiting for the database", not "stuck".
OUTAGE_COMPONENTS = frozenset({"accounting", "runtime"})


class WorkerStuckError(RuntimeError):
    """Healing did not help: the worker exits so that a fresh one takes over."""


@dataclass
class _Mark:
    generation: int
    position: Hashable
    since: float


@dataclass
class StallTracker:
    """Partitions with work left whose position has not moved for ``stall_seconds``.

    A new consumer generation (a rebalance) starts every clock again.
    """

    stall_seconds: float
    _marks: dict[Hashable, _Mark] = field(default_factory=dict)

    def observe(
        self,
        generation: int,
        progress: Mapping[Hashable, tuple[Hashable, int]],
        now: float,
    ) -> list[Hashable]:
        """``progress``: partition → (where it is, work remaining); the stalled ones."""
        stalled = []
        for key, (position, remaining) in progress.items():
            mark = self._marks.get(key)
            if (
                remaining <= 0
                or mark is None
                or (mark.generation, mark.position)
                != (
                    generation,
                    position,
                )
            ):
                self._marks[key] = _Mark(generation, position, now)
                continue
            if now - mark.since >= self.stall_seconds:
                stalled.append(key)
        for key in set(self._marks) - set(progress):
            del self._marks[key]
        return stalled

    def restart(self, key: Hashable, now: float) -> None:
        """Give a healed partition a full ``stall_seconds`` again."""
        mark = self._marks.get(key)
        if mark is not None:
            mark.since = now


@dataclass(frozen=True)
class WatchdogLimits:
    stall_seconds: float = 20.0
    heals_before_exit: int = 3


class Watchdog:
    def __init__(
        self,
        app: Callable[[], Any],
        *,
        health: Health,
        metrics: Metrics,
        watched_topics: set[str],
        limits: WatchdogLimits = WatchdogLimits(),
        clock: Callable[[], float] = time.monotonic,
        crash: Callable[[BaseException], Awaitable[None]] | None = None,
    ) -> None:
        self._app = app
        self._health = health
        self._metrics = metrics
        self._watched = watched_topics
        self._limits = limits
        self._clock = clock
        self._crash = crash
        self._trackers = {
            "table recovery": StallTracker(limits.stall_seconds),
            "reading": StallTracker(limits.stall_seconds),
        }
        # partition → (what, re-seeks so far, position when last re-sought)
        self._healed: dict[Any, tuple[str, int, Hashable]] = {}
        self._delivered: Hashable = None  # every read offset at the last look

    async def tick(self) -> None:
        """One look (a timer): an error here must never take the worker down."""
        try:
            await self._look()
        except Exception:
            log.exception("watchdog pass failed; next pass in a moment")

    async def _look(self) -> None:
        app = self._app()
        consumer = app.consumer
        if consumer is None or not consumer.assignment():
            return
        recovery = app.tables.recovery
        generation = int(app.consumer_generation_id or 0)
        if recovery.in_recovery:
            progress = {
                tp: (recovery.active_offsets.get(tp), remaining)
                for tp, remaining in recovery.active_remaining().items()
            }
            await self._watch("table recovery", generation, progress, consumer)
            return
        progress = {} if self._outage() else self._reading_progress(consumer)
        await self._watch("reading", generation, progress, consumer)

    async def _watch(
        self,
        what: str,
        generation: int,
        progress: dict[Any, tuple[Hashable, int]],
        consumer: Any,
    ) -> None:
        now = self._clock()
        for other, tracker in self._trackers.items():
            if other != what:
                tracker.observe(generation, {}, now)
        self._settle(what, progress)
        for tp in self._trackers[what].observe(generation, progress, now):
            if not self._unchanged(generation, what):
                return  # a rebalance began during this pass: its observations are stale
            position = progress[tp][0]
            if await self._heal(what, tp, position, consumer):
                self._trackers[what].restart(tp, now)

    def _unchanged(self, generation: int, what: str) -> bool:
        """Is the consumer still where this pass looked? A re-seek after a
        rebalance acts on positions of the old assignment: in the hour soak,
        re-seeks 1 s into a new generation (while Faust sought the same
        partitions for recovery) came with committed offsets past three
        messages never stored. Heals wait for a pass of their own."""
        app = self._app()
        if int(app.consumer_generation_id or 0) != generation:
            return False
        if what == "table recovery":
            # Faust keeps ``rebalancing`` set until recovery is over: refusing
            # on it would never heal the stall this branch is for.
            return bool(app.tables.recovery.in_recovery)
        return not getattr(app, "rebalancing", False) and not app.tables.recovery.in_recovery

    def _outage(self) -> bool:
        """Accounting waiting on the database (or the worker still opening it at
        start-up) explains a partition that does not move."""
        return any(p.component in OUTAGE_COMPONENTS for p in self._health.problems())

    def _reading_progress(self, consumer: Any) -> dict[Any, tuple[Hashable, int]]:
        """Where each watched partition is: (offset read, offset committed).

        Both, because a slow agent with a full buffer reads nothing for a while
        but still commits; a stuck partition does neither. (Faust keeps both
        privately; there is no public accessor.)
        """
        read = getattr(consumer, "_read_offset", {})
        committed = getattr(consumer, "_committed_offset", {})
        delivered = tuple(sorted((tuple(tp), offset) for tp, offset in read.items()))
        waiting = _waiting_in_fetch_buffer(consumer) if delivered != self._delivered else set()
        self._delivered = delivered
        progress: dict[Any, tuple[Hashable, int]] = {}
        for tp in consumer.assignment():
            highwater = consumer.highwater(tp) if tp.topic in self._watched else None
            if highwater is None:
                continue
            position = read.get(tp)
            remaining = highwater - (position + 1 if position is not None else 0)
            progress[tp] = ((position, committed.get(tp)), 0 if tp in waiting else remaining)
        return progress

    async def _heal(self, what: str, tp: Any, position: Hashable, consumer: Any) -> bool:
        """Re-seek a stalled partition; ``False`` once re-seeking has not helped."""
        _, heals, _ = self._healed.get(tp, (what, 0, None))
        name = f"{tp.topic}:{tp.partition}"
        detail = f"{what} of {name} made no progress for {self._limits.stall_seconds:.0f}s"
        self._health.report(f"watchdog {name}", detail)
        self._metrics.watchdog_heals.labels(what).inc()
        if heals >= self._limits.heals_before_exit:
            log.error(
                "%s after %d re-seeks: exiting for a fresh worker to take over", detail, heals
            )
            self._metrics.count_watchdog_exit()
            if self._crash is not None:
                await self._crash(WorkerStuckError(f"{detail} after {heals} re-seeks"))
            return False
        log.warning(
            "%s: re-seeking it (%d of %d)", detail, heals + 1, self._limits.heals_before_exit
        )
        self._healed[tp] = (what, heals + 1, position)
        offset = position if what == "table recovery" and isinstance(position, int) else None
        await self._reseek(consumer, tp, offset, from_committed=what == "reading")
        return True

    async def _reseek(
        self, consumer: Any, tp: Any, offset: int | None, *, from_committed: bool
    ) -> None:
        """What recovery (or a restart) would do: resume the partition and seek it again.

        Recovery's own target is its last offset (from 0 when there is none); a
        source partition goes back to its committed offset (records read twice
        are harmless: every write is idempotent).
        """
        # Recovery's partitions are aiokafka's ``TopicPartition`` (keys of its
        # end offsets); Faust's ``resume_partitions`` adds them to its active set
        # as given, and its next fetch then fails an ``isinstance(x, TP)``
        # assertion that crashes the worker (agents cancelled, exit status 1).
        tp = TP(tp.topic, tp.partition)
        try:
            consumer.resume_partitions({tp})
            if from_committed:
                offset = await _committed_offset(consumer, tp)
            target = max(offset if offset is not None else 0, 0)
            if from_committed:
                await seek_to_reread(consumer, {tp: target})
            else:
                await consumer.seek_wait({tp: target})
        except Exception as error:  # a rebalance may have moved it meanwhile: next tick
            log.warning("could not re-seek %s:%d: %s", tp.topic, tp.partition, error)

    def _settle(self, what: str, progress: Mapping[Any, tuple[Hashable, int]]) -> None:
        """A healed partition that moves again (or left) closes its problem."""
        for tp, (kind, _, position) in list(self._healed.items()):
            if kind == "table recovery" and what == "reading":
                moved = True  # recovery is over
            else:
                now_at = progress.get(tp)
                moved = now_at is None or now_at[1] <= 0 or _advanced(position, now_at[0])
            if moved:
                del self._healed[tp]
                self._health.clear(f"watchdog {tp.topic}:{tp.partition}")


def _waiting_in_fetch_buffer(consumer: Any) -> set[TP]:
    """Partitions whose fetched records wait their turn in aiokafka's buffer.

    aiokafka hands fetched records out partition by partition, in the order
    they were fetched, and fetches a partition again only once its buffer is
    drained: under a backlog a control partition's records wait behind
    megabytes fetched for the messages partitions (over 30 s at 1,000 events/s
    in the turn-read bench), slow but not stuck, and re-seeking it only throws
    its buffer away. Called only while Faust is delivering records (a wedged
    drain loop still counts as stalled); a partition Faust has paused is not
    waiting. Read from aiokafka's thread's objects without a lock: a dict
    lookup is atomic, and a wrong answer costs one pass.
    """
    try:
        buffer = consumer._thread._ensure_consumer()._fetcher._records
        active = getattr(consumer, "_active_partitions", None)
        return {
            tp
            for tp in consumer.assignment()
            if _has_more(buffer.get(tp)) and (active is None or tp in active)
        }
    except Exception:  # aiokafka's internals moved: every partition may stall again
        log.debug("could not read aiokafka's fetch buffer", exc_info=True)
        return set()


def _has_more(fetched: Any) -> bool:
    """A ``FetchResult`` with records left (an error in its place has none)."""
    return fetched is not None and bool(getattr(fetched, "has_more", lambda: False)())


def _advanced(before: Hashable, now: Hashable) -> bool:
    """Real progress since a re-seek: for reading, the committed offset moved (the
    re-seek itself moves the read offset); for recovery, its offset moved."""
    if isinstance(before, tuple) and isinstance(now, tuple):
        return bool(before[1] != now[1])
    return before != now


async def _committed_offset(consumer: Any, tp: TP) -> int | None:
    """This partition's committed offset, nothing sought. Faust's
    ``seek_to_committed`` seeks *every* assigned partition back: a re-seek of one
    control partition rewound the commands partitions under commands still
    running (the processor agent crashed on offsets seen twice) and the messages
    partitions under acks in flight (in the chaos re-seek scenario, a message
    lost with its offset committed). aiokafka's consumer runs on Faust's thread."""
    thread = consumer._thread
    client = thread._ensure_consumer()
    offset = await thread.call_thread(client.committed, tp)
    return int(offset) if offset is not None else None
