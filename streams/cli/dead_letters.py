"""``compactor dead-letters list`` and ``redrive``: look at dead letters, and send them
back to their source topic once each after the cause was fixed.

A re-driven record is the dead letter's value, key and headers (``dlq.*``
removed), sent to the partition it was first read from
(``dlq.source_topic`` / ``dlq.source_partition``), with the header
``compactor.redriven-from: topic:partition:offset`` naming the original.

**Once each, even when interrupted.** What was re-driven is kept in a ledger,
the log-compacted topic ``{prefix}dead-letters-redriven``, keyed by the
original record's (source topic, partition, offset), so a dead letter that
was dead-lettered twice is still re-driven once. Each record goes through
three acknowledged steps: an *intent* in the ledger (with the source
partition's end offset at that moment), the record itself, then *done*. A
redrive killed anywhere leaves at most intents without a done; the next
redrive reads the source partition from each intent's offset and looks for
the record's ``compactor.redriven-from`` header: found, it records *done*
without sending; not found, it sends. The producer is idempotent (no
duplicates from its own retries). Why not a Kafka transaction: the worker
reads the messages topic without ``read_committed``, so an aborted
transaction's record would still be read; the header check holds whatever
the readers' isolation.

A dead letter that cannot be re-driven is reported and left alone: a redacted
one (``[kafka].dead_letter_content = "redacted"``, the default: re-drive it
from the source topic's offset while it is retained), a truncated one, or one
whose source is not the messages topic. Only producers' messages are
re-driven: a dead letter read from the erase-requests, control or commands
topic is refused, so a redrive (run under an operator's principal, which may
write the erase topic) can never republish an erase request or a control
event that the service refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError
from pydantic import ValidationError

from core.settings import KafkaSettings
from streams.dead_letter_headers import DeadLetterHeaders
from streams.kafka.admin import MIN_INSYNC_REPLICAS, Replication, cluster_brokers
from streams.kafka.security import PLAINTEXT, KafkaSecurity

LEDGER_SUFFIX = "dead-letters-redriven"
REDRIVEN_FROM = "compactor.redriven-from"


class RedriveError(RuntimeError):
    """Reading or writing a topic failed; the message names it."""


@dataclass(frozen=True)
class DeadLetter:
    """One record of the dead-letter topic, with its ``dlq.*`` headers parsed."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    meta: DeadLetterHeaders

    @property
    def source(self) -> str:
        """The ledger's key: where the record was first read."""
        m = self.meta
        return f"{m.source_topic}:{m.source_partition}:{m.source_offset}"

    def original_headers(self) -> list[tuple[str, bytes]]:
        """The record's own headers: no ``dlq.*``, and no earlier re-drive's mark."""
        return [(k, v) for k, v in self.headers if not k.startswith("dlq.") and k != REDRIVEN_FROM]

    def unsendable(self, messages_topic: str) -> str | None:
        """Why this dead letter cannot be re-driven, or None. Only a record of
        ``messages_topic`` can: the other topics are the service's and the
        operators' (an erase request, a control event), never re-sent as they were."""
        if self.meta.source_topic != messages_topic:
            return (
                f"source topic {self.meta.source_topic!r} is not the messages topic "
                f"{messages_topic!r}: only producers' messages are re-driven"
            )
        if self.meta.redacted or self.value is None:
            return "redacted: no content (re-drive it from the source topic's offset)"
        if self.meta.truncated:
            return "truncated: only the record's first bytes were kept"
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "dead_letter": f"{self.partition}@{self.offset}",
            "source": self.source,
            "failed_at": self.meta.failed_at.isoformat(),
            "error_type": self.meta.error_type,
            "reason": self.meta.reason,
            "key": None if self.key is None else self.key.decode("utf-8", "replace"),
            "size": self.meta.original_size,
            "truncated": self.meta.truncated,
            "redacted": self.meta.redacted,
        }


@dataclass(frozen=True)
class LedgerEntry:
    state: Literal["intent", "done"]
    scan_from: int  # the source partition's end offset before the record was sent
    redriven_offset: int | None = None
    at: str = ""

    def encode(self) -> bytes:
        return json.dumps(
            {
                "state": self.state,
                "scan_from": self.scan_from,
                "redriven_offset": self.redriven_offset,
                "at": self.at,
            }
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> LedgerEntry:
        data = json.loads(raw)
        return cls(data["state"], int(data["scan_from"]), data.get("redriven_offset"), data["at"])


def since_time(text: str, now: datetime | None = None) -> datetime:
    """``--since``: an ISO 8601 time (UTC when it has no zone) or an age: 30m, 6h, 2d."""
    current = now or datetime.now(UTC)
    age = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if age:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[age.group(2)]
        return current - timedelta(**{unit: int(age.group(1))})
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"--since {text!r}: give an ISO 8601 time (2026-11-25T09:00) or an age (30m, 6h, 2d)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def selected(
    letters: Iterable[DeadLetter], reason: str | None = None, since: datetime | None = None
) -> list[DeadLetter]:
    """The dead letters ``--reason`` (an error type, or words of the reason) and
    ``--since`` (failed at or after) pick, the first of each source only."""
    chosen: dict[str, DeadLetter] = {}
    for letter in letters:
        if reason is not None and not (
            letter.meta.error_type == reason or reason.lower() in letter.meta.reason.lower()
        ):
            continue
        if since is not None and letter.meta.failed_at < since:
            continue
        chosen.setdefault(letter.source, letter)
    return list(chosen.values())


@dataclass
class RedrivePlan:
    """What a redrive will do, decided from the dead letters and the ledger alone."""

    send: list[DeadLetter] = field(default_factory=list)
    check: list[tuple[DeadLetter, LedgerEntry]] = field(default_factory=list)  # intents
    done: list[DeadLetter] = field(default_factory=list)  # re-driven before
    unsendable: list[tuple[DeadLetter, str]] = field(default_factory=list)


def plan_redrive(
    letters: Sequence[DeadLetter], ledger: dict[str, LedgerEntry], messages_topic: str
) -> RedrivePlan:
    """Each source once (a record may be dead-lettered twice), by what the ledger says;
    only records of ``messages_topic`` are sent."""
    plan = RedrivePlan()
    seen: set[str] = set()
    for letter in letters:
        if letter.source in seen:
            continue
        seen.add(letter.source)
        entry = ledger.get(letter.source)
        why = letter.unsendable(messages_topic)
        if entry is not None and entry.state == "done":
            plan.done.append(letter)
        elif why is not None:
            plan.unsendable.append((letter, why))
        elif entry is not None:
            plan.check.append((letter, entry))
        else:
            plan.send.append(letter)
    return plan


# -- Kafka -----------------------------------------------------------------------


def reader(bootstrap: str, security: KafkaSecurity) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        client_id="compactor-dead-letters",
        **security.client_kwargs(),
    )


async def read_topic(
    bootstrap: str,
    topic: str,
    security: KafkaSecurity = PLAINTEXT,
    start: dict[int, int] | None = None,
    partitions: Iterable[int] | None = None,
) -> list[Any]:
    """Every record of ``topic`` (of ``partitions``; from ``start`` offsets, else the
    beginning) up to its end offsets when called; [] when the topic does not exist."""
    consumer = reader(bootstrap, security)
    try:
        await consumer.start()
        await consumer._client.force_metadata_update()
        known = consumer.partitions_for_topic(topic)
        if not known:
            return []
        wanted = sorted(known if partitions is None else set(partitions) & set(known))
        assigned = [TopicPartition(topic, p) for p in wanted]
        if not assigned:
            return []
        consumer.assign(assigned)
        ends = await consumer.end_offsets(assigned)
        from_start = [tp for tp in assigned if start is None or tp.partition not in start]
        if from_start:
            await consumer.seek_to_beginning(*from_start)
        for tp in assigned:
            if start is not None and tp.partition in start:
                consumer.seek(tp, start[tp.partition])
        records: list[Any] = []
        while True:
            # The position moves when the fetcher buffers records, before getmany returns
            # them: once every position is at the end, one more getmany drains the buffer.
            drain = not await _behind(consumer, assigned, ends)
            batches = await consumer.getmany(*assigned, timeout_ms=0 if drain else 500)
            for tp, found in batches.items():
                records += [r for r in found if r.offset < ends[tp]]
            if drain and not batches:
                break
        return records
    except KafkaError as error:
        raise RedriveError(f"reading {topic} on {bootstrap} failed: {error}") from error
    finally:
        await consumer.stop()


async def _behind(
    consumer: AIOKafkaConsumer, assigned: Sequence[TopicPartition], ends: dict[Any, int]
) -> bool:
    """Whether some partition is not read up to its end offset yet."""
    for tp in assigned:
        if await consumer.position(tp) < ends[tp]:
            return True
    return False


async def read_dead_letters(
    bootstrap: str, topic: str, security: KafkaSecurity = PLAINTEXT
) -> tuple[list[DeadLetter], int]:
    """The dead letters, and how many records were not (no or bad ``dlq.*`` headers)."""
    letters, unreadable = [], 0
    for record in await read_topic(bootstrap, topic, security):
        headers = tuple((k, bytes(v)) for k, v in record.headers or ())
        try:
            meta = DeadLetterHeaders.from_kafka(list(headers))
        except ValidationError:
            unreadable += 1
            continue
        letters.append(
            DeadLetter(record.partition, record.offset, record.key, record.value, headers, meta)
        )
    return letters, unreadable


async def read_ledger(
    bootstrap: str, topic: str, security: KafkaSecurity = PLAINTEXT
) -> dict[str, LedgerEntry]:
    """The ledger's latest entry per source (a tombstone forgets one)."""
    ledger: dict[str, LedgerEntry] = {}
    for record in await read_topic(bootstrap, topic, security):
        if record.key is None:
            continue
        source = record.key.decode()
        if record.value is None:
            ledger.pop(source, None)
            continue
        try:
            ledger[source] = LedgerEntry.decode(record.value)
        except (ValueError, KeyError, TypeError):
            continue  # not ours: never taken for a done
    return ledger


async def ensure_ledger(
    bootstrap: str, topic: str, kafka: KafkaSettings, security: KafkaSecurity = PLAINTEXT
) -> None:
    """The ledger topic, compacted and replicated like the service's own topics."""
    replication = Replication.of(kafka, await cluster_brokers(bootstrap, security=security))
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    await admin.start()
    try:
        if topic in set(await admin.list_topics()):
            return
        configs = {"cleanup.policy": "compact", MIN_INSYNC_REPLICAS: str(replication.min_insync)}
        new = NewTopic(topic, 1, replication.factor, topic_configs=configs)
        try:
            await admin.create_topics([new])
        except TopicAlreadyExistsError:
            return
    except KafkaError as error:
        raise RedriveError(f"creating {topic} on {bootstrap} failed: {error}") from error
    finally:
        await admin.close()
