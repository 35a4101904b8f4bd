"""Topic creation: every topic with the same partition count (co-partitioned).

Relying on broker auto-creation would give whatever ``num.partitions`` the
broker has, and a messages topic with a different partition count than the
table's changelog would send a conversation's events to a worker that does
not own its tally.

Topics are created with the configs ``topic_configs`` names: the clip-archive
topic log-compacted (the erase's tombstone then removes a conversation's
clip-archives), the messages and dead-letter topics with the retentions of
``[kafka]``. An existing topic keeps its configs: the worker never alters a
topic (docs/security.md says how to apply them with ``kafka-configs``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from core.settings import KafkaSettings
from streams.kafka.security import PLAINTEXT, KafkaSecurity
from streams.topics import TopicNames

log = logging.getLogger("compactor.admin")


class TopicMismatchError(RuntimeError):
    pass


TOPIC_ALREADY_EXISTS = 36  # Kafka protocol error code
HOUR_MS = 3_600_000
SEGMENT_MS = 24 * HOUR_MS  # the longest a segment of a content topic stays open


def topic_configs(
    names: TopicNames, kafka: KafkaSettings | None = None
) -> dict[str, dict[str, str]]:
    """Topic name → the configs it is created with (the broker's defaults otherwise).

    erase-completions is an event stream (ids and counts, read by ``erase --wait``),
    not per-conversation state, so it keeps the default delete policy."""
    kafka = kafka or KafkaSettings()
    return {
        names.clip_archives: {"cleanup.policy": "compact"},
        names.messages: _deleted_after(kafka.messages_retention_hours),
        names.dead_letters: _deleted_after(kafka.dead_letters_retention_hours),
    }


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

    Returns each topic's partition count. A topic just created can briefly be
    described with no partitions while its metadata propagates, so the
    description is retried until every topic shows some (or ``settle_seconds``).
    """
    wanted = names.all()
    configs = topic_configs(names) if configs is None else configs
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [name for name in wanted if name not in existing]
        if missing:
            response = await admin.create_topics(
                [
                    NewTopic(
                        name,
                        partitions,
                        replication_factor,
                        topic_configs=dict(configs.get(name, {})),
                    )
                    for name in missing
                ]
            )
            errors = [
                (topic, code, message)
                for topic, code, message, *_ in response.topic_errors
                if code not in (0, TOPIC_ALREADY_EXISTS)  # another worker may race us
            ]
            if errors:
                raise TopicMismatchError(f"could not create topics: {errors}")
            log.info("created topics %s (%d partitions)", ", ".join(missing), partitions)
        deadline = asyncio.get_running_loop().time() + settle_seconds
        while True:
            described = await admin.describe_topics(wanted)
            counts = {d["topic"]: len(d["partitions"]) for d in described}
            settled = len(counts) == len(wanted) and all(counts.values())
            if settled or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.2)
    finally:
        await admin.close()
    wrong = {topic: n for topic, n in counts.items() if n != partitions}
    if wrong:
        raise TopicMismatchError(
            f"topics must all have {partitions} partitions ([kafka].partitions) to stay "
            f"co-partitioned, but {wrong} differ; recreate them or change the setting"
        )
    return counts


DYNAMIC_TOPIC_CONFIG = 1  # DescribeConfigs v1+ config_source: set on the topic itself


async def describe_topic_configs(
    bootstrap: str, topics: list[str], *, security: KafkaSecurity = PLAINTEXT
) -> dict[str, dict[str, str | None]]:
    """Topic → every config's current value, as the broker reports it."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    await admin.start()
    try:
        return {name: values for name, (values, _) in (await _describe(admin, topics)).items()}
    finally:
        await admin.close()


async def _describe(
    admin: AIOKafkaAdminClient, topics: list[str]
) -> dict[str, tuple[dict[str, str | None], dict[str, str | None]]]:
    """Topic → (every config, those set on the topic itself)."""
    responses = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, topic) for topic in topics]
    )
    found: dict[str, tuple[dict[str, str | None], dict[str, str | None]]] = {}
    for response in responses:
        for error_code, error_message, _, name, entries, *_ in response.resources:
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


async def config_drift(
    bootstrap: str,
    configs: Mapping[str, Mapping[str, str]],
    *,
    security: KafkaSecurity = PLAINTEXT,
    apply: bool = False,
) -> dict[str, dict[str, tuple[str | None, str]]]:
    """Topic → {config: (current, wanted)} where an existing topic differs from
    ``configs``. With ``apply``, set the wanted values (keeping every other config
    set on the topic: AlterConfigs replaces a topic's whole dynamic set) and
    return what differed before."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    await admin.start()
    try:
        described = await _describe(admin, list(configs))
        drift = {
            topic: {
                key: (described[topic][0].get(key), value)
                for key, value in wanted.items()
                if described[topic][0].get(key) != value
            }
            for topic, wanted in configs.items()
            if topic in described
        }
        drift = {topic: keys for topic, keys in drift.items() if keys}
        if apply and drift:
            resources = [
                ConfigResource(
                    ConfigResourceType.TOPIC,
                    topic,
                    configs={**described[topic][1], **configs[topic]},
                )
                for topic in drift
            ]
            for response in await admin.alter_configs(resources):
                for error_code, error_message, _, name, *_ in response.resources:
                    if error_code:
                        raise TopicMismatchError(f"cannot alter {name}: {error_message}")
            log.info("altered the configs of %s", ", ".join(drift))
        return drift
    finally:
        await admin.close()
