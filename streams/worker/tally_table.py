"""The token table, read and written as ``ConversationTally`` values, through a cache.

Writing a Faust table entry produces a changelog record: about half a
millisecond here, more than everything else accounting does per message. So
the working tallies live in memory and each changed ("dirty") entry reaches
the table once per ``flush_seconds``, however many messages changed it
(Kafka Streams' record cache does the same). Nothing is lost by writing late:
PostgreSQL is the source of truth, and an entry this worker has not checked
against it since it got the partition is resynced from the store on first
touch (``synced``), so an entry restored stale from the changelog is repaired
before it is trusted.

Because the table is written late, a message's offset is acked only once the
entry it changed is flushed (``AcksAfterFlush``): what is acked is in the
changelog.

The cache also keeps the reconciliation index: the entries reconciliation
can act on (a command outstanding, or over budget and not stalled), so a
pass costs what it can do, not the size of the table. The index is rebuilt by
a scan of the table after each assignment (``rebuild_index``).

Underneath, anything with ``get``/``__setitem__``/``pop``/``items`` works: a
Faust ``Table`` in the worker, a dict in tests and the offline CLI. A Faust
table write must happen "inside" an event of the entry's partition;
``write_context(partition)`` provides that (``streams.kafka.table_context``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from core.domain.tally import ConversationTally

log = logging.getLogger("compactor.worker")

WriteContext = Callable[[int | None], AbstractContextManager[Any]]


# Fields the previous release's entries do not have (0.2.0: docs/operations.md,
# "Upgrading"). Its workers read an entry strictly, and one holding any of them
# failed every message of that conversation until dead-lettered (found by
# tests/chaos/test_upgrade.py). So they are written only when they hold
# something, which a conversation does only with a feature turned on after the
# upgrade (idle compaction, recompact/restore); and fields this release does not
# know (the next one's) are dropped on reading.
_SINCE_PREVIOUS_RELEASE = ("last_message_at", "request", "queued")


MAX_STRETCH_SECONDS = 10.0
"""The longest a flush interval is stretched (``TallyTable._next_interval``): the
longest an offset commit waits for the table under a wide burst."""

FLUSH_STEP = 250
"""Entries a flush writes between two yields to the event loop (~20 ms)."""


def table_value(tally: ConversationTally) -> dict[str, Any]:
    """The entry as the table holds it: readable by this release and the previous one."""
    unset = {
        name
        for name in _SINCE_PREVIOUS_RELEASE
        if getattr(tally, name) == ConversationTally.model_fields[name].default
    }
    return tally.model_dump(exclude=unset)


def read_tally(raw: Mapping[str, Any]) -> ConversationTally:
    """An entry written by this release, the previous one or the next one."""
    known = ConversationTally.model_fields
    return ConversationTally.model_validate({k: v for k, v in raw.items() if k in known})


@dataclass
class _Entry:
    tally: ConversationTally
    partition: int | None
    synced: bool  # checked against the store since this worker got the partition
    dirty: bool


def _no_context(_: int | None) -> AbstractContextManager[Any]:
    return nullcontext()


class TallyTable:
    def __init__(
        self,
        table: MutableMapping[str, Any],
        *,
        candidate: Callable[[ConversationTally], bool] = lambda t: t.outstanding is not None,
        flush_seconds: float = 0.0,
        writes_per_second: float = 0.0,
        max_cached: int = 200_000,
        write_context: WriteContext | None = None,
        on_write: Callable[[int], None] = lambda _: None,
        on_interval: Callable[[float], None] = lambda _: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._table = table
        self._candidate = candidate
        self._flush_seconds = flush_seconds
        self._writes_per_second = writes_per_second
        self._interval = flush_seconds  # stretched after a large flush (``_next_interval``)
        self._max_cached = max_cached
        self._write_context = write_context or _no_context
        self._on_write = on_write
        self._on_interval = on_interval
        on_interval(flush_seconds)
        self._clock = clock
        self._cache: OrderedDict[str, _Entry] = OrderedDict()
        self._dirty: set[str] = set()
        self._index: set[str] = set()
        self._index_valid = False
        self._last_flush = clock()
        self._epochs: dict[int | None, int] = {}

    # -- reading -------------------------------------------------------------

    def get(self, conversation_id: str) -> ConversationTally | None:
        entry = self._cache.get(conversation_id)
        if entry is not None:
            self._cache.move_to_end(conversation_id)
            return entry.tally
        raw = self._table.get(conversation_id)
        return None if raw is None else read_tally(raw)

    def synced(self, conversation_id: str) -> bool:
        """Has this worker taken the store's counts for it since the assignment?"""
        entry = self._cache.get(conversation_id)
        return entry is not None and entry.synced

    def items(self) -> Iterator[tuple[str, ConversationTally]]:
        """Every entry, the cached ones as the cache has them; the table is read as
        ``rebuild_index`` reads it (lazily where it can be)."""
        seen: set[str] = set()
        for conversation_id, entry in list(self._cache.items()):
            seen.add(conversation_id)
            yield conversation_id, entry.tally
        for conversation_id, raw in self._scan():
            if raw is not None and conversation_id not in seen:
                yield conversation_id, read_tally(raw)

    # -- writing -------------------------------------------------------------

    def epoch(self, partition: int | None) -> int:
        """Bumped by ``forget``: work begun before a revocation must not cache its result."""
        return self._epochs.get(partition, 0)

    def put(
        self,
        tally: ConversationTally,
        *,
        partition: int | None = None,
        synced: bool | None = None,
        epoch: int | None = None,
    ) -> bool:
        """Cache the entry and mark it dirty; ``flush`` writes it to the table.

        ``False`` (and nothing cached) when ``epoch`` predates a revocation of
        the partition: the group was in flight when the partition left, and
        whoever owns it now resyncs from the store."""
        if epoch is not None and epoch != self.epoch(partition):
            return False
        conversation_id = tally.conversation_id
        previous = self._cache.pop(conversation_id, None)
        if partition is None and previous is not None:
            partition = previous.partition
        self._cache[conversation_id] = _Entry(
            tally=tally,
            partition=partition,
            synced=synced if synced is not None else bool(previous and previous.synced),
            dirty=True,
        )
        self._dirty.add(conversation_id)
        self._index_entry(conversation_id, tally)
        return True

    def delete(self, conversation_id: str, *, partition: int | None = None) -> None:
        """Now, not at the next flush: an erasure must not wait (a changelog tombstone)."""
        self._cache.pop(conversation_id, None)
        self._dirty.discard(conversation_id)
        self._index.discard(conversation_id)
        if conversation_id in self._table:
            with self._write_context(partition):
                self._table.pop(conversation_id, None)

    def flush_due(self) -> bool:
        return self._clock() - self._last_flush >= self._interval

    def _next_interval(self, written: int) -> float:
        """``flush_seconds``, or longer after a flush of many entries, so the table
        takes at most ``writes_per_second`` on average (0: no limit), up to
        ``MAX_STRETCH_SECONDS``.

        Each entry written is a changelog record, ~0.3 ms of this worker and the
        broker on a 2-core machine: with 2,000 conversations active every
        second, a flush each second spent half of accounting's time writing the
        table (docs/performance.md, section 2). A longer interval writes each
        entry once for more of its messages; what it delays is the offset
        commit (acks wait for the flush), never a message or a command."""
        if self._writes_per_second <= 0:
            return self._flush_seconds
        stretched = min(written / self._writes_per_second, MAX_STRETCH_SECONDS)
        return max(self._flush_seconds, stretched)

    def flush(self, *, force: bool = False, only: Collection[str] | None = None) -> int:
        """Write the dirty entries (``only`` those) if ``flush_seconds`` have passed
        since the last flush, or ``force``; the number written."""
        now = self._clock()
        if only is None and not force and not self.flush_due():
            return 0
        written = sum(self._write(p, keys) for p, keys in self._due(only).items())
        return self._flushed(written, now, whole=only is None)

    async def flush_in_steps(self, step: int = FLUSH_STEP) -> int:
        """``flush(force=True)``, yielding to the event loop after every ``step``
        entries: at ~70 µs an entry (a profile's figure, docs/performance.md
        section 2), 10,000 dirty entries would hold the loop (reads,
        heartbeats, compactions) for ~0.7 s. An entry changed meanwhile
        is written as it is then, or at the next flush; one forgotten meanwhile
        (its partition revoked) is skipped."""
        now = self._clock()
        written = unyielded = 0
        for partition, keys in self._due(None).items():
            for start in range(0, len(keys), step):
                written += self._write(partition, keys[start : start + step])
                unyielded += len(keys[start : start + step])
                if unyielded >= step:  # a flush of fewer entries runs in one go, as before
                    await asyncio.sleep(0)
                    unyielded = 0
        return self._flushed(written, now, whole=True)

    def _due(self, only: Collection[str] | None) -> dict[int | None, list[str]]:
        """The dirty entries (``only`` those), by partition."""
        keys = list(self._dirty) if only is None else self._dirty.intersection(only)
        by_partition: dict[int | None, list[str]] = {}
        for conversation_id in keys:
            by_partition.setdefault(self._cache[conversation_id].partition, []).append(
                conversation_id
            )
        return by_partition

    def _write(self, partition: int | None, keys: list[str]) -> int:
        try:
            context = self._write_context(partition)
        except LookupError:  # no event of that partition seen yet: next flush
            return 0
        written = 0
        with context:
            for conversation_id in keys:
                entry = self._cache.get(conversation_id)
                if entry is None or conversation_id not in self._dirty:
                    continue  # forgotten, or written by another flush meanwhile
                self._table[conversation_id] = table_value(entry.tally)
                entry.dirty = False
                self._dirty.discard(conversation_id)
                written += 1
        return written

    def _flushed(self, written: int, started: float, *, whole: bool) -> int:
        if whole:
            self._last_flush = started
            self._interval = self._next_interval(written)
            self._on_interval(self._interval)
        self._on_write(written)
        self._evict()
        return written

    def flush_partitions(self, partitions: Collection[int]) -> int:
        """Write the dirty entries of ``partitions`` now (before they are revoked)."""
        wanted = [c for c in self._dirty if self._cache[c].partition in partitions]
        return self.flush(only=wanted) if wanted else 0

    def _evict(self) -> None:
        """Forget the least recently used clean entries beyond ``max_cached``."""
        excess = len(self._cache) - self._max_cached
        for conversation_id in list(self._cache)[: max(0, excess)]:
            if not self._cache[conversation_id].dirty:
                del self._cache[conversation_id]

    def forget(self, partitions: Collection[int]) -> int:
        """Drop what the cache holds for revoked partitions, dirty or not: their new
        owner resyncs each entry from the store before it trusts it."""
        for partition in partitions:
            self._epochs[partition] = self.epoch(partition) + 1
        gone = [c for c, e in self._cache.items() if e.partition in partitions]
        for conversation_id in gone:
            del self._cache[conversation_id]
            self._dirty.discard(conversation_id)
            self._index.discard(conversation_id)
        return len(gone)

    @property
    def dirty(self) -> int:
        return len(self._dirty)

    @property
    def cached(self) -> int:
        return len(self._cache)

    # -- the reconciliation index --------------------------------------------

    def _index_entry(self, conversation_id: str, tally: ConversationTally) -> None:
        if self._candidate(tally):
            self._index.add(conversation_id)
        else:
            self._index.discard(conversation_id)

    def consider(self, conversation_id: str) -> None:
        """Put an entry in the index (the store says it may need a command)."""
        self._index.add(conversation_id)

    def candidates(self) -> list[str]:
        return list(self._index)

    def drop_candidate(self, conversation_id: str) -> None:
        self._index.discard(conversation_id)

    @property
    def index_valid(self) -> bool:
        return self._index_valid

    def invalidate_index(self) -> None:
        """The assignment changed: restored entries may be missing from the index."""
        self._index_valid = False

    async def rebuild_index(self, yield_every: int = 500) -> int:
        """Scan the whole table once, yielding to the event loop every ``yield_every``
        entries (a million RocksDB entries must not stall the worker)."""
        self._index_valid = True  # an invalidation during the scan scans again
        found = set(self._index)
        for scanned, (conversation_id, raw) in enumerate(self._scan()):
            if scanned % yield_every == yield_every - 1:
                await asyncio.sleep(0)
            entry = self._cache.get(conversation_id)
            if entry is not None:
                tally = entry.tally
            elif raw is None:
                continue
            else:  # no validation: a 4x faster scan, and the candidate is re-read anyway
                tally = ConversationTally.model_construct(**raw)
            if self._candidate(tally):
                found.add(conversation_id)
        self._index |= found
        return len(self._index)

    def _scan(self) -> Iterator[tuple[str, Any]]:
        """The table's items without copying them all first, where it allows that.

        A RocksDB table iterates lazily (a copy of a million entries would stall
        for seconds); a dict cannot be iterated while the agents write to it, so
        it is copied, which is fast for a dict."""
        if isinstance(self._table, dict):
            yield from list(self._table.items())
            return
        try:
            yield from self._table.items()
        except RuntimeError:  # changed during the iteration: fall back to a copy
            yield from list(self._table.items())
