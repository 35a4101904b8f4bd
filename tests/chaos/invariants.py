"""What must hold after any fault, checked against PostgreSQL, the topics and the workers.

Every scenario ends with ``check_invariants`` polled until all hold:

``lost``
    every produced message id is live in ``messages`` or in some
    ``archival_memory.source_message_ids``;
``duplicated``
    no id both live and in a live batch, none in two live batches (a batch a
    fold, a recompact or a restore replaced is superseded: a depth-n batch
    names the messages of the batches it folded, a recompact's batches those
    of the batches they re-summarised), and no live message row that nobody
    produced (a malformed record stored after all);
``split_tool_pairs``
    no tool call live while its result is archived, or the reverse (pairs as
    ``core.domain.split`` defines them);
``over_budget``
    every conversation's live token total (clip-archive included) is at or
    under ``context_budget x model_max_tokens``;
``table_drift``
    the owning worker's table entry (``GET /conversations/{id}`` on the worker
    that owns the conversation's messages partition) equals PostgreSQL's
    ``sum(token_estimate)`` and ``count(*)``, with no compaction outstanding;
``dead_letters``
    every malformed record produced is on the dead-letter topic with its
    source coordinates, a reason and the expected error type, its bytes kept
    (or, with ``dlq.truncated``, a prefix of them); nothing else is there;
``consumer_lag``
    the worker group has committed every messages partition to its end (a
    partition frozen in changelog recovery shows here first);
``worker_health``
    every worker that should run does and answers ``/healthz`` with ``ok``;
``offsets_ahead``
    no committed offset of the worker group on the messages topic was ever
    ahead of PostgreSQL: every produced message below a committed offset
    (Kafka's committed offset is the next one to read) was live or archived
    when looked for. Sampled every second while the scenario runs
    (``OffsetWatch``, the offsets read before the store, so a message stored
    in between is no false alarm), and once more at the end. ``lost`` only
    sees a loss the faults made final; this sees the moment an offset got
    ahead, whether or not a crash followed.

Failure text names what is wrong: ids, partitions, offsets, conversations
and both sides of every disagreement.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import asyncpg

from streams.topics import TopicNames
from tests.chaos.kafka_tools import committed_offsets, group_progress, read_topic
from tests.chaos.workload import tool_pairs
from tests.support.worker import WorkerProcess

if TYPE_CHECKING:
    from tests.support.kafka_io import Record

INVARIANTS = (
    "lost",
    "duplicated",
    "split_tool_pairs",
    "over_budget",
    "table_drift",
    "dead_letters",
    "consumer_lag",
    "worker_health",
    "offsets_ahead",
)


@dataclass(frozen=True)
class ProducedMessage:
    message_id: str
    conversation_id: str
    partition: int
    offset: int


@dataclass(frozen=True)
class MalformedRecord:
    what: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    error_types: tuple[str, ...]  # any of these is right; empty = any


@dataclass
class InvariantContext:
    db: asyncpg.Pool
    bootstrap: str
    names: TopicNames
    partitions: int
    group: str
    produced: Mapping[str, ProducedMessage]
    conversations: Mapping[str, Sequence[Mapping[str, Any]]]
    malformed: Sequence[MalformedRecord]
    workers: Sequence[WorkerProcess]
    budget_tokens: int
    table_sample: int = 200
    rng_seed: int = 0
    offset_watch: OffsetWatch | None = None


@dataclass
class InvariantReport:
    violations: dict[str, list[str]] = field(default_factory=lambda: {n: [] for n in INVARIANTS})
    # How many items violate each invariant (a line may summarise several).
    totals: Counter[str] = field(default_factory=Counter)

    def add(self, name: str, line: str, items: int = 1) -> None:
        self.violations[name].append(line)
        self.totals[name] += items

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def counts(self) -> dict[str, int]:
        return {name: self.totals[name] for name in INVARIANTS}

    def describe(self, limit: int = 15) -> str:
        parts = []
        for name in INVARIANTS:
            lines = self.violations[name]
            if not lines:
                continue
            shown = "\n    ".join(lines[:limit])
            more = f"\n    ... and {len(lines) - limit} more lines" if len(lines) > limit else ""
            parts.append(f"  {name} ({self.totals[name]}):\n    {shown}{more}")
        return "\n".join(parts) or "  all invariants hold"


@dataclass
class _Snapshot:
    live: dict[str, asyncpg.Record]
    tallies: dict[str, tuple[int, int]]  # conversation -> (sum token_estimate, count)
    compactions: Counter[str]  # conversation -> committed compactions
    archived_any: set[str]
    # message id -> the live batches (not superseded) that name it
    archived_live: dict[str, list[str]]


async def _snapshot(db: asyncpg.Pool) -> _Snapshot:
    async with db.acquire() as conn, conn.transaction(isolation="repeatable_read"):
        rows = await conn.fetch("SELECT id, conversation_id, kind, token_estimate FROM messages")
        batches = await conn.fetch(
            "SELECT id, source_message_ids, superseded_by IS NULL AS live FROM archival_memory"
        )
        compactions = await conn.fetch("SELECT conversation_id FROM compactions")
    live = {r["id"]: r for r in rows}
    tallies: dict[str, tuple[int, int]] = {}
    for r in rows:
        total, count = tallies.get(r["conversation_id"], (0, 0))
        tallies[r["conversation_id"]] = (total + int(r["token_estimate"]), count + 1)
    archived_any: set[str] = set()
    in_live: dict[str, list[str]] = defaultdict(list)
    for b in batches:
        archived_any.update(b["source_message_ids"])
        if b["live"]:
            for message_id in b["source_message_ids"]:
                in_live[message_id].append(b["id"])
    return _Snapshot(
        live=live,
        tallies=tallies,
        compactions=Counter(r["conversation_id"] for r in compactions),
        archived_any=archived_any,
        archived_live=dict(in_live),
    )


def _check_lost(ctx: InvariantContext, snap: _Snapshot, report: InvariantReport) -> None:
    lost = [
        p
        for p in ctx.produced.values()
        if p.message_id not in snap.live and p.message_id not in snap.archived_any
    ]
    if not lost:
        return
    by_conversation: dict[str, list[ProducedMessage]] = defaultdict(list)
    for p in lost:
        by_conversation[p.conversation_id].append(p)
    by_partition = Counter(p.partition for p in lost)
    report.add(
        "lost",
        f"{len(lost)} of {len(ctx.produced)} produced messages neither live nor archived, "
        f"in {len(by_conversation)} conversations; by partition {dict(sorted(by_partition.items()))}",
        items=0,
    )
    for cid, items in sorted(by_conversation.items(), key=lambda kv: -len(kv[1])):
        first = sorted(items, key=lambda p: p.offset)
        total, count = snap.tallies.get(cid, (0, 0))
        report.add(
            "lost",
            f"{cid} (p{first[0].partition}): {len(items)} lost, e.g. "
            + ", ".join(f"{p.message_id}@{p.offset}" for p in first[:5])
            + f"; PostgreSQL has {count} live rows ({total} tokens), "
            f"{snap.compactions.get(cid, 0)} compactions",
            items=len(items),
        )


def _check_duplicated(ctx: InvariantContext, snap: _Snapshot, report: InvariantReport) -> None:
    for message_id, row in snap.live.items():
        if row["kind"] != "message":
            continue
        if message_id in snap.archived_live:
            report.add(
                "duplicated",
                f"{message_id} ({row['conversation_id']}) is live and archived "
                f"(live batches {snap.archived_live[message_id]})",
            )
        if message_id not in ctx.produced:
            report.add(
                "duplicated",
                f"live row {message_id!r} ({row['conversation_id']!r}) was never produced as a "
                "valid message (a malformed record stored?)",
            )
    for message_id, batch_ids in snap.archived_live.items():
        if len(batch_ids) > 1:
            report.add(
                "duplicated", f"{message_id} archived by {len(batch_ids)} batches {batch_ids}"
            )


def _check_tool_pairs(ctx: InvariantContext, snap: _Snapshot, report: InvariantReport) -> None:
    def state(message_id: str) -> str:
        if message_id in snap.live:
            return "live"
        return "archived" if message_id in snap.archived_any else "missing"

    for cid, events in ctx.conversations.items():
        produced = [e for e in events if str(e["message_id"]) in ctx.produced]
        for call, result in tool_pairs(produced):
            states = {state(call), state(result)}
            if states == {"live", "archived"}:
                report.add(
                    "split_tool_pairs",
                    f"{cid}: call {call} is {state(call)}, result {result} is {state(result)}",
                )


def _check_budget(ctx: InvariantContext, snap: _Snapshot, report: InvariantReport) -> None:
    for cid in ctx.conversations:
        total, count = snap.tallies.get(cid, (0, 0))
        if total > ctx.budget_tokens:
            report.add(
                "over_budget",
                f"{cid}: {total} tokens in {count} live rows > budget {ctx.budget_tokens} "
                f"({snap.compactions.get(cid, 0)} compactions committed)",
            )


async def _owners(ctx: InvariantContext, report: InvariantReport) -> dict[int, list[str]]:
    owners: dict[int, list[str]] = defaultdict(list)
    for worker in ctx.workers:
        partitions = await worker.assigned(ctx.names.messages) if worker.alive else None
        for partition in partitions or ():
            owners[partition].append(worker.name)
    return owners


async def _check_table(
    ctx: InvariantContext, snap: _Snapshot, report: InvariantReport, over_budget: set[str]
) -> None:
    by_name = {w.name: w for w in ctx.workers}
    owners = await _owners(ctx, report)
    partition_of = {p.conversation_id: p.partition for p in ctx.produced.values()}
    conversations = sorted(cid for cid in ctx.conversations if cid in partition_of)
    if len(conversations) > ctx.table_sample:
        sample = set(random.Random(ctx.rng_seed).sample(conversations, ctx.table_sample))
        conversations = sorted(sample | (over_budget & set(conversations)))
    bad_partitions = {p: names for p, names in owners.items() if len(names) != 1}
    missing = sorted(set(range(ctx.partitions)) - set(owners))
    if missing or bad_partitions:
        report.add(
            "table_drift",
            f"messages partitions without exactly one owner: unowned {missing}, "
            f"shared {bad_partitions}",
            items=0,
        )
    gate = asyncio.Semaphore(12)

    async def one(cid: str) -> None:
        partition = partition_of[cid]
        names = owners.get(partition, [])
        if len(names) != 1:
            report.add("table_drift", f"{cid} (p{partition}): no single owner ({names})")
            return
        worker = by_name[names[0]]
        total, count = snap.tallies.get(cid, (0, 0))
        async with gate:
            try:
                status, body = await worker.get(f"/conversations/{cid}", timeout=10.0)
            except Exception as error:
                report.add("table_drift", f"{cid} (p{partition}, {worker.name}): {error!r}")
                return
        if status != 200 or not isinstance(body, dict):
            report.add(
                "table_drift",
                f"{cid} (p{partition}, {worker.name}): HTTP {status} {body!r}; PostgreSQL "
                f"total={total} count={count}",
            )
            return
        table = (body.get("token_total"), body.get("message_count"))
        if table != (total, count) or body.get("compaction_outstanding") is not None:
            report.add(
                "table_drift",
                f"{cid} (p{partition}, {worker.name}): table total={table[0]} count={table[1]} "
                f"outstanding={body.get('compaction_outstanding')} generation="
                f"{body.get('generation')} compactions={body.get('compactions')} vs PostgreSQL "
                f"total={total} count={count} compactions={snap.compactions.get(cid, 0)} "
                f"(drift {None if table[0] is None else table[0] - total} tokens)",
            )

    await asyncio.gather(*(one(cid) for cid in conversations))


def _header(record: Record, name: str) -> str | None:
    for key, value in record.headers:
        if key == name:
            return value.decode(errors="replace")
    return None


async def _check_dead_letters(ctx: InvariantContext, report: InvariantReport) -> None:
    records = await read_topic(ctx.bootstrap, ctx.names.dead_letters, ctx.partitions)
    by_origin: dict[tuple[str | None, str | None], list[Record]] = defaultdict(list)
    for record in records:
        by_origin[
            (_header(record, "dlq.source_partition"), _header(record, "dlq.source_offset"))
        ].append(record)
    expected: set[tuple[str | None, str | None]] = set()
    for bad in ctx.malformed:
        expected.add((str(bad.partition), str(bad.offset)))
        found = by_origin.get((str(bad.partition), str(bad.offset)), [])
        where = f"{bad.what} (p{bad.partition}@{bad.offset}, {len(bad.value)} bytes)"
        if not found:
            report.add("dead_letters", f"{where}: not on {ctx.names.dead_letters}")
            continue
        record = found[0]
        problems = []
        reason = _header(record, "dlq.reason") or ""
        error_type = _header(record, "dlq.error_type")
        if not reason.strip():
            problems.append("no dlq.reason")
        if bad.error_types and error_type not in bad.error_types:
            problems.append(f"dlq.error_type {error_type!r}, expected one of {bad.error_types}")
        if _header(record, "dlq.source_topic") != ctx.names.messages:
            problems.append(f"dlq.source_topic {_header(record, 'dlq.source_topic')!r}")
        truncated = (_header(record, "dlq.truncated") or "").lower() == "true"
        value = record.value or b""
        if value != bad.value and not (truncated and bad.value.startswith(value)):
            problems.append(
                f"value differs ({len(value)} bytes, truncated={truncated}) from the original"
            )
        if truncated and _header(record, "dlq.original_size") != str(len(bad.value)):
            problems.append(f"dlq.original_size {_header(record, 'dlq.original_size')!r}")
        key = record.key
        if key != bad.key and not (truncated and bad.key and key and bad.key.startswith(key)):
            problems.append(f"key {key!r:.60} differs from {bad.key!r:.60}")
        if problems:
            report.add(
                "dead_letters", f"{where}: " + "; ".join(problems) + f" (reason {reason!r:.120})"
            )
    for source, found in by_origin.items():
        if source in expected:
            continue
        for record in found:
            try:
                message_id = json.loads(record.value or b"").get("message_id")
            except (ValueError, AttributeError):
                message_id = None
            report.add(
                "dead_letters",
                f"unexpected dead letter from p{source[0]}@{source[1]} (message {message_id!r}): "
                f"{_header(record, 'dlq.error_type')}: {_header(record, 'dlq.reason')!r:.160}",
            )


def lagging_partitions(progress: Mapping[int, tuple[int, int]]) -> dict[int, int]:
    """{partition: records behind} for the partitions the group has not read to the end.

    A partition that never received a record has nothing to commit: its committed
    offset stays -1 (none) against an end of 0, and that is not lag. With random
    conversation ids, 30 keys miss one of 6 partitions about once in 40 runs."""
    behind = {}
    for partition, (committed, end) in progress.items():
        read = max(committed, 0)
        if read < end:
            behind[partition] = end - read
    return behind


async def _check_lag(ctx: InvariantContext, report: InvariantReport) -> None:
    progress = await group_progress(ctx.bootstrap, ctx.group, ctx.names.messages, ctx.partitions)
    for partition, records in sorted(lagging_partitions(progress).items()):
        committed, end = progress[partition]
        report.add(
            "consumer_lag",
            f"{ctx.names.messages}:{partition}: group {ctx.group} committed {committed} "
            f"of {end} ({records} records behind)",
        )


async def _check_health(ctx: InvariantContext, report: InvariantReport) -> None:
    for worker in ctx.workers:
        if not worker.alive:
            report.add("worker_health", f"{worker.name}: not running")
            continue
        health = await worker.health()
        if health is None or health.get("status") != "ok":
            report.add("worker_health", f"{worker.name}: /healthz answered {health!r}")


class OffsetWatch:
    """Is a committed offset of the messages topic ever ahead of PostgreSQL?

    Each ``sample`` reads the group's committed offsets, then asks PostgreSQL
    for the produced messages below them that it has not seen stored yet. A
    message once found stays found (compaction moves it to
    ``archived_messages`` in the same transaction), so each is looked up
    until it is seen once. A sample that cannot run (broker or PostgreSQL
    away) is skipped and counted.
    """

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.topic = topic
        self.partitions = partitions
        self.samples = 0
        self.skipped = 0
        self.violations: list[str] = []
        self._seen: set[str] = set()
        self._flagged: set[str] = set()

    async def sample(self, db: asyncpg.Pool, produced: Mapping[str, ProducedMessage]) -> None:
        try:
            committed = await asyncio.wait_for(
                committed_offsets(self.bootstrap, self.group, self.topic, self.partitions), 10
            )
            below = [
                p
                for p in list(produced.values())
                if p.message_id not in self._seen and p.offset < committed.get(p.partition, -1)
            ]
            missing = await asyncio.wait_for(_not_stored(db, below), 20)
        except Exception:
            self.skipped += 1
            return
        self.samples += 1
        gone = {p.message_id for p in missing}
        self._seen.update(p.message_id for p in below if p.message_id not in gone)
        for p in missing:
            if p.message_id in self._flagged:
                continue
            self._flagged.add(p.message_id)
            self.violations.append(
                f"{p.message_id} ({p.conversation_id}) at {self.topic}:{p.partition}@{p.offset} "
                f"was not in PostgreSQL while group {self.group} had committed "
                f"{committed.get(p.partition)} (sample {self.samples})"
            )


async def _not_stored(
    db: asyncpg.Pool, messages: Sequence[ProducedMessage]
) -> list[ProducedMessage]:
    """Those of ``messages`` neither live nor archived (by their primary keys)."""
    if not messages:
        return []
    rows = await db.fetch(
        """
        SELECT c.cid, c.mid
        FROM unnest($1::text[], $2::text[]) AS c(cid, mid)
        WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = c.cid AND m.id = c.mid)
          AND NOT EXISTS (
              SELECT 1 FROM archived_messages a WHERE a.conversation_id = c.cid AND a.id = c.mid
          )
        """,
        [p.conversation_id for p in messages],
        [p.message_id for p in messages],
    )
    absent = {(r["cid"], r["mid"]) for r in rows}
    return [p for p in messages if (p.conversation_id, p.message_id) in absent]


async def _check_offsets(ctx: InvariantContext, report: InvariantReport) -> None:
    watch = ctx.offset_watch or OffsetWatch(
        ctx.bootstrap, ctx.group, ctx.names.messages, ctx.partitions
    )
    before = watch.samples
    await watch.sample(ctx.db, ctx.produced)
    if watch.samples == before:
        report.add("offsets_ahead", "check could not run (broker or PostgreSQL away)", items=0)
    for line in watch.violations:
        report.add("offsets_ahead", line)


async def _guarded(
    report: InvariantReport, name: str, check: Callable[[], Awaitable[None]]
) -> None:
    """A check that cannot run (PostgreSQL or the broker away) is a violation, not a crash."""
    try:
        await check()
    except Exception as error:
        report.add(name, f"check could not run: {error!r:.300}")


@dataclass(frozen=True)
class ClipArchiveCopies:
    """How many clip-archive events the topic holds for how many compactions."""

    events: int  # records with a value (tombstones are not events)
    distinct: int  # distinct compaction ids among them
    committed: int  # compactions committed in PostgreSQL

    @property
    def extra(self) -> int:
        return self.events - self.distinct

    @property
    def rate(self) -> float:
        """Extra copies per committed compaction (0.05: 5 copies for 100 compactions)."""
        return self.extra / self.committed if self.committed else 0.0


async def clip_archive_copies(ctx: InvariantContext) -> ClipArchiveCopies:
    """Delivery is at least once, so a compaction's event may be on the topic twice;
    every copy is work and noise for every consumer, so the scenarios report the rate
    (and the kill scenario bounds it)."""
    records = await read_topic(ctx.bootstrap, ctx.names.clip_archives, ctx.partitions)
    ids = [json.loads(r.value)["compaction_id"] for r in records if r.value is not None]
    committed = int(await ctx.db.fetchval("SELECT count(*) FROM compactions"))
    return ClipArchiveCopies(len(ids), len(set(ids)), committed)


async def check_invariants(ctx: InvariantContext) -> InvariantReport:
    report = InvariantReport()
    try:
        snap = await _snapshot(ctx.db)
    except Exception as error:
        for name in ("lost", "duplicated", "split_tool_pairs", "over_budget", "table_drift"):
            report.add(name, f"PostgreSQL snapshot failed: {error!r:.300}")
    else:
        _check_lost(ctx, snap, report)
        _check_duplicated(ctx, snap, report)
        _check_tool_pairs(ctx, snap, report)
        _check_budget(ctx, snap, report)
        over = {
            cid for cid in ctx.conversations if snap.tallies.get(cid, (0, 0))[0] > ctx.budget_tokens
        }
        await _guarded(report, "table_drift", lambda: _check_table(ctx, snap, report, over))
    await _guarded(report, "dead_letters", lambda: _check_dead_letters(ctx, report))
    await _guarded(report, "consumer_lag", lambda: _check_lag(ctx, report))
    await _guarded(report, "worker_health", lambda: _check_health(ctx, report))
    await _guarded(report, "offsets_ahead", lambda: _check_offsets(ctx, report))
    return report
