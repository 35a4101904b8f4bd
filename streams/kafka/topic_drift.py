"""Existing topics against the settings: ``compactor topics`` reports what
differs, and with ``--apply-configs`` sets the configs.

The worker itself never alters a topic (``streams.kafka.admin`` only creates
missing ones), and refuses to start on a clip-archive topic that is not
log-compacted (``refuse_clip_archives_without_compaction``). A replication
factor that differs is reported, never changed: that is a partition
reassignment (``kafka-reassign-partitions``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from core.settings import KafkaSettings
from streams.kafka.admin import (
    AT_LEAST,
    MIN_INSYNC_REPLICAS,
    PreparedTopics,
    TopicMismatchError,
    describe_configs,
    topic_configs,
)
from streams.kafka.security import PLAINTEXT, KafkaSecurity
from streams.topics import TopicNames

log = logging.getLogger("compactor.admin")


def _differs(key: str, current: str | None, wanted: str) -> bool:
    if key in AT_LEAST and current is not None and current.isdigit() and wanted.isdigit():
        return int(current) < int(wanted)
    return current != wanted


async def config_drift(
    bootstrap: str,
    configs: Mapping[str, Mapping[str, str]],
    *,
    security: KafkaSecurity = PLAINTEXT,
    apply: bool = False,
) -> dict[str, dict[str, tuple[str | None, str]]]:
    """Topic → {config: (current, wanted)} where an existing topic differs from
    ``configs`` (for ``AT_LEAST`` configs: is smaller). With ``apply``, set the
    wanted values (keeping every other config set on the topic: AlterConfigs
    replaces a topic's whole dynamic set) and return what differed before."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    await admin.start()
    try:
        described = await describe_configs(admin, list(configs))
        drift = {
            topic: {
                key: (described[topic][0].get(key), value)
                for key, value in wanted.items()
                if _differs(key, described[topic][0].get(key), value)
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


async def replica_counts(
    bootstrap: str, topics: list[str], *, security: KafkaSecurity = PLAINTEXT
) -> dict[str, int]:
    """Topic → its replication factor (the fewest replicas of any of its partitions)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    return {
        d["topic"]: min(len(p["replicas"]) for p in d["partitions"])
        for d in described
        if d["partitions"]
    }


@dataclass(frozen=True)
class TopicDrift:
    """What differs between the existing topics and the settings."""

    #: topic → {config: (current, wanted)}; applied when asked.
    configs: dict[str, dict[str, tuple[str | None, str]]]
    #: topic → (replicas, wanted): a partition reassignment, never applied here.
    replicas: dict[str, tuple[int, int]]

    def __bool__(self) -> bool:
        return bool(self.configs or self.replicas)


async def topic_drift(
    bootstrap: str,
    kafka: KafkaSettings,
    prepared: PreparedTopics,
    *,
    security: KafkaSecurity = PLAINTEXT,
    apply: bool = False,
) -> TopicDrift:
    """Existing topics against the settings: their configs (``min.insync.replicas``
    by each topic's own replica count, the dead-letter topic's size by the source
    topics'), and their replication factor. An unset ``replication_factor`` only
    wants at least the default (a topic with more replicas is not drift)."""
    names = TopicNames.with_prefix(kafka.topic_prefix)
    replicas = await replica_counts(bootstrap, names.all(), security=security)
    replication = prepared.replication
    wanted = topic_configs(names, kafka, largest_record=prepared.largest_record)
    for topic, count in replicas.items():
        wanted.setdefault(topic, {})[MIN_INSYNC_REPLICAS] = str(
            replication.wanted_min_insync(kafka, count)
        )
    configs = await config_drift(bootstrap, wanted, security=security, apply=apply)
    fewer = {
        topic: (count, replication.factor)
        for topic, count in replicas.items()
        if count < replication.factor or (replication.explicit and count != replication.factor)
    }
    return TopicDrift(configs, fewer)


def refuse_clip_archives_without_compaction(prepared: PreparedTopics, names: TopicNames) -> None:
    """The worker's refusal to start on a clip-archive topic that is not log-compacted
    (a topic created before the service made it, by hand or by broker auto-creation,
    with ``cleanup.policy=delete``): an erase's tombstone removes nothing from such a
    topic, so every erased conversation's summaries would stay readable for its
    whole retention, unnoticed. Refused rather than warned about: the erase promise
    would be broken for every conversation, and the fix is one command."""
    policy = prepared.clip_archives_policy
    if policy is not None and "compact" in policy.split(","):
        return
    raise TopicMismatchError(
        f"{names.clip_archives} has cleanup.policy={policy}, not compact: an erase's "
        "tombstone would not remove the erased conversation's clip-archives (docs/security.md, "
        "Erase); run `compactor topics --apply-configs` (or kafka-configs --alter "
        "--add-config cleanup.policy=compact) and start the worker again"
    )
