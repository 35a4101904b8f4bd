"""Topic creation: every topic with the same partition count (co-partitioned).

Relying on broker auto-creation would give whatever ``num.partitions`` the
broker has, and a messages topic with a different partition count than the
table's changelog would send a conversation's events to a worker that does
not own its tally.

Topics are created with the configs ``topic_configs`` names: the clip-archive
topic log-compacted (the erase's tombstone then removes a conversation's
clip-archives), the messages and dead-letter topics with the retentions of
``[kafka]``, every topic with ``min.insync.replicas``. The dead-letter topic
is created last, to accept whole the largest record the source topics accept
(their ``max.message.bytes``) plus the dead letter's own headers. An existing
topic keeps its configs: the worker never alters a topic (``compactor topics``
reports what differs, ``--apply-configs`` applies it: ``streams.kafka.topic_drift``;
docs/security.md says how with ``kafka-configs``), but it refuses to start on a
clip-archive topic that is not log-compacted
(``streams.kafka.topic_drift.refuse_clip_archives_without_compaction``):
erases would not hold there.

Replication (``Replication``): ``[kafka].replication_factor`` and
``min_insync_replicas``, or when unset 3 replicas (fewer on a smaller
cluster) with ``default_min_insync`` of them, so the defaults work on one
broker and on a production cluster alike.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from core.settings import ConfigError, KafkaSettings, default_min_insync
from streams.kafka.security import PLAINTEXT, KafkaSecurity
from streams.topics import TopicNames
from streams.worker.dead_letters import REQUEST_OVERHEAD_BYTES

log = logging.getLogger("compactor.admin")


class TopicMismatchError(RuntimeError):
    pass


TOPIC_ALREADY_EXISTS = 36  # Kafka protocol error code
HOUR_MS = 3_600_000
SEGMENT_MS = 24 * HOUR_MS  # the longest a segment of a content topic stays open


#: Most replicas an unset ``[kafka].replication_factor`` asks for.
DEFAULT_REPLICATION_FACTOR = 3
#: What a dead letter adds to the record it carries (key up to 4 KiB, dlq.* headers).
DEAD_LETTER_HEADROOM_BYTES = REQUEST_OVERHEAD_BYTES
MAX_MESSAGE_BYTES = "max.message.bytes"
MIN_INSYNC_REPLICAS = "min.insync.replicas"
CLEANUP_POLICY = "cleanup.policy"
#: Configs where more than wanted is fine: only a smaller value is drift.
AT_LEAST = frozenset({MAX_MESSAGE_BYTES})


@dataclass(frozen=True)
class Replication:
    """How many replicas the service's topics get, and how many must be in sync
    for a write (acks=all) to be acknowledged."""

    factor: int
    min_insync: int
    #: Both came from the settings (else from the cluster's size).
    explicit: bool = False

    @classmethod
    def of(cls, kafka: KafkaSettings, brokers: int) -> Replication:
        """``[kafka]``'s values; unset, 3 replicas (fewer on a smaller cluster) and
        ``default_min_insync`` of them. A ConfigError names the key that cannot work."""
        factor = kafka.replication_factor or max(1, min(DEFAULT_REPLICATION_FACTOR, brokers))
        min_insync = kafka.min_insync_replicas or default_min_insync(factor)
        if min_insync > factor:
            raise ConfigError(
                f"[kafka].min_insync_replicas = {min_insync} is more than the {factor} "
                f"replica(s) of the topics (a cluster of {brokers} broker(s); set "
                "[kafka].replication_factor): no write could ever be acknowledged"
            )
        return cls(factor, min_insync, explicit=kafka.replication_factor is not None)

    def wanted_min_insync(self, kafka: KafkaSettings, replicas: int) -> int:
        """``min.insync.replicas`` for an existing topic of ``replicas`` replicas:
        the setting, else the default for the topic's own replica count (so a
        topic created while a broker was down is not told to lower it)."""
        return kafka.min_insync_replicas or default_min_insync(replicas)


def topic_configs(
    names: TopicNames,
    kafka: KafkaSettings | None = None,
    replication: Replication | None = None,
    *,
    largest_record: int | None = None,
) -> dict[str, dict[str, str]]:
    """Topic name → the configs it is created with (the broker's defaults otherwise).

    erase-completions is an event stream (ids and counts, read by ``erase --wait``),
    not per-conversation state, so it keeps the default delete policy. With
    ``replication``, every topic gets its ``min.insync.replicas``; with
    ``largest_record`` (the source topics' largest ``max.message.bytes``), the
    dead-letter topic accepts that plus a dead letter's headers."""
    kafka = kafka or KafkaSettings()
    configs: dict[str, dict[str, str]] = {
        names.clip_archives: {CLEANUP_POLICY: "compact"},
        names.messages: _deleted_after(kafka.messages_retention_hours),
        names.dead_letters: _deleted_after(kafka.dead_letters_retention_hours),
    }
    if replication is not None:
        for name in names.all():
            configs.setdefault(name, {})[MIN_INSYNC_REPLICAS] = str(replication.min_insync)
    if largest_record is not None:
        configs[names.dead_letters][MAX_MESSAGE_BYTES] = str(dead_letter_bytes(largest_record))
    return configs


def dead_letter_bytes(largest_record: int) -> int:
    """The ``max.message.bytes`` a dead-letter topic needs to take whole a record of
    ``largest_record`` bytes with the dead letter's key and headers."""
    return largest_record + DEAD_LETTER_HEADROOM_BYTES


def source_topics(names: TopicNames) -> list[str]:
    """The topics the worker reads: any of their records may be dead-lettered."""
    return [names.messages, names.commands, names.control, names.erasures]


def _deleted_after(hours: float) -> dict[str, str]:
    """Records deleted after ``hours``: a segment is deleted only once it is closed, so
    segments roll at least daily and a record lives at most the retention plus a day."""
    retention = round(hours * HOUR_MS)
    return {
        "cleanup.policy": "delete",
        "retention.ms": str(retention),
        "segment.ms": str(min(retention, SEGMENT_MS)),
    }


async def ensure_topics(
    bootstrap: str,
    names: TopicNames,
    *,
    partitions: int,
    replication_factor: int,
    settle_seconds: float = 15.0,
    security: KafkaSecurity = PLAINTEXT,
    configs: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, int]:
    """Create missing topics (with ``configs``, by default ``topic_configs(names)``);
    fail if an existing one has another partition count.

    The dead-letter topic is created after the others, with a
    ``max.message.bytes`` that takes whole the largest record they accept
    (unless ``configs`` sets one). Returns each topic's partition count. A
    topic just created can briefly be described with no partitions while its
    metadata propagates, so the description is retried until every topic
    shows some (or ``settle_seconds``).
    """
    wanted = names.all()
    configs = topic_configs(names) if configs is None else configs
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [name for name in wanted if name not in existing]
        await _create_missing(admin, names, missing, partitions, replication_factor, configs)
        counts = await _settled_counts(admin, wanted, settle_seconds)
    finally:
        await admin.close()
    wrong = {topic: n for topic, n in counts.items() if n != partitions}
    if wrong:
        raise TopicMismatchError(
            f"topics must all have {partitions} partitions ([kafka].partitions) to stay "
            f"co-partitioned, but {wrong} differ; recreate them or change the setting"
        )
    return counts


async def _create_missing(
    admin: AIOKafkaAdminClient,
    names: TopicNames,
    missing: list[str],
    partitions: int,
    replication_factor: int,
    configs: Mapping[str, Mapping[str, str]],
) -> None:
    """The missing topics, the dead-letter topic last: sized by the others."""
    first = [name for name in missing if name != names.dead_letters]
    await _create(admin, first, partitions, replication_factor, configs)
    if names.dead_letters in missing:
        dead_letters = dict(configs.get(names.dead_letters, {}))
        if MAX_MESSAGE_BYTES not in dead_letters:
            largest = await _largest_record(admin, source_topics(names))
            dead_letters[MAX_MESSAGE_BYTES] = str(dead_letter_bytes(largest))
        await _create(
            admin,
            [names.dead_letters],
            partitions,
            replication_factor,
            {names.dead_letters: dead_letters},
        )
    if missing:
        log.info(
            "created topics %s (%d partitions, %d replicas)",
            ", ".join(missing),
            partitions,
            replication_factor,
        )


async def _create(
    admin: AIOKafkaAdminClient,
    topics: list[str],
    partitions: int,
    replication_factor: int,
    configs: Mapping[str, Mapping[str, str]],
) -> None:
    if not topics:
        return
    response = await admin.create_topics(
        [
            NewTopic(
                name, partitions, replication_factor, topic_configs=dict(configs.get(name, {}))
            )
            for name in topics
        ]
    )
    errors = [
        (topic, code, message)
        for topic, code, message, *_ in response.topic_errors
        if code not in (0, TOPIC_ALREADY_EXISTS)  # another worker may race us
    ]
    if errors:
        raise TopicMismatchError(f"could not create topics: {errors}")


async def _settled_counts(
    admin: AIOKafkaAdminClient, wanted: list[str], settle_seconds: float
) -> dict[str, int]:
    deadline = asyncio.get_running_loop().time() + settle_seconds
    while True:
        described = await admin.describe_topics(wanted)
        counts = {d["topic"]: len(d["partitions"]) for d in described}
        settled = len(counts) == len(wanted) and all(counts.values())
        if settled or asyncio.get_running_loop().time() > deadline:
            return counts
        await asyncio.sleep(0.2)


async def _largest_record(admin: AIOKafkaAdminClient, topics: list[str]) -> int:
    """The largest ``max.message.bytes`` of ``topics`` (the broker's default for
    those that set none)."""
    described = await describe_configs(admin, topics)
    return max(int(values[MAX_MESSAGE_BYTES] or 0) for values, _ in described.values())


async def cluster_brokers(bootstrap: str, *, security: KafkaSecurity = PLAINTEXT) -> int:
    """How many brokers the cluster's metadata lists now."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    await admin.start()
    try:
        return len((await admin.describe_cluster())["brokers"])
    finally:
        await admin.close()


@dataclass(frozen=True)
class PreparedTopics:
    """The topics as the worker found (or made) them before it starts."""

    counts: dict[str, int]
    replication: Replication
    #: The largest record a source topic accepts (its ``max.message.bytes``).
    largest_record: int
    #: What the dead-letter topic accepts.
    dead_letter_limit: int
    #: The clip-archive topic's ``cleanup.policy`` as the broker reports it.
    clip_archives_policy: str | None = "compact"


async def prepare_topics(
    bootstrap: str, kafka: KafkaSettings, *, security: KafkaSecurity = PLAINTEXT
) -> PreparedTopics:
    """Replication resolved against the cluster, the topics created with it, and
    the record sizes the producers must follow."""
    names = TopicNames.with_prefix(kafka.topic_prefix)
    replication = Replication.of(kafka, await cluster_brokers(bootstrap, security=security))
    counts = await ensure_topics(
        bootstrap,
        names,
        partitions=kafka.partitions,
        replication_factor=replication.factor,
        security=security,
        configs=topic_configs(names, kafka, replication),
    )
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    await admin.start()
    try:
        largest = await _largest_record(admin, source_topics(names))
        dead_letter_limit = await _largest_record(admin, [names.dead_letters])
        clip_archives = await describe_configs(admin, [names.clip_archives])
    finally:
        await admin.close()
    policy = clip_archives[names.clip_archives][0].get(CLEANUP_POLICY)
    return PreparedTopics(counts, replication, largest, dead_letter_limit, policy)


def worker_kafka(kafka: KafkaSettings, prepared: PreparedTopics) -> KafkaSettings:
    """``[kafka]`` as the worker runs it: the replication resolved, and a producer
    request limit large enough to dead-letter whole any record a source topic accepts."""
    return kafka.model_copy(
        update={
            "replication_factor": prepared.replication.factor,
            "min_insync_replicas": prepared.replication.min_insync,
            "max_request_bytes": max(
                kafka.max_request_bytes, dead_letter_bytes(prepared.largest_record)
            ),
        }
    )


DYNAMIC_TOPIC_CONFIG = 1  # DescribeConfigs v1+ config_source: set on the topic itself


async def describe_topic_configs(
    bootstrap: str, topics: list[str], *, security: KafkaSecurity = PLAINTEXT
) -> dict[str, dict[str, str | None]]:
    """Topic → every config's current value, as the broker reports it."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    await admin.start()
    try:
        return {
            name: values for name, (values, _) in (await describe_configs(admin, topics)).items()
        }
    finally:
        await admin.close()


UNKNOWN_TOPIC_OR_PARTITION = 3  # Kafka protocol error code


async def describe_configs(
    admin: AIOKafkaAdminClient, topics: list[str], settle_seconds: float = 15.0
) -> dict[str, tuple[dict[str, str | None], dict[str, str | None]]]:
    """Topic → (every config, those set on the topic itself).

    In a cluster, the broker asked may not know a topic created a moment ago
    (its metadata still propagating): that answer is retried for
    ``settle_seconds``."""
    deadline = asyncio.get_running_loop().time() + settle_seconds
    while True:
        try:
            return await _describe_once(admin, topics)
        except _NotYetKnown:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


class _NotYetKnown(TopicMismatchError):
    pass


async def _describe_once(
    admin: AIOKafkaAdminClient, topics: list[str]
) -> dict[str, tuple[dict[str, str | None], dict[str, str | None]]]:
    responses = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, topic) for topic in topics]
    )
    found: dict[str, tuple[dict[str, str | None], dict[str, str | None]]] = {}
    for response in responses:
        for error_code, error_message, _, name, entries, *_ in response.resources:
            if error_code == UNKNOWN_TOPIC_OR_PARTITION:
                raise _NotYetKnown(f"cannot describe {name}: unknown topic {error_message}")
            if error_code:
                raise TopicMismatchError(f"cannot describe {name}: {error_message}")
            values: dict[str, str | None] = {}
            own: dict[str, str | None] = {}
            for entry in entries:
                key, value, _read_only, source = entry[0], entry[1], entry[2], entry[3]
                values[key] = value
                # v0 has is_default (a bool) where v1+ has config_source
                dynamic = source is False if isinstance(source, bool) else source == 1
                if dynamic:
                    own[key] = value
            found[name] = (values, own)
    return found
