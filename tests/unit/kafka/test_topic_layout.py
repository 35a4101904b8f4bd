"""Replication and sizes of the service's topics, decided from the settings and the cluster.

Why: defaults that work on one broker and on a three-broker cluster alike
(3 replicas, min.insync.replicas 2, fewer on a smaller cluster), a setting
that could never acknowledge a write refused by name, and a dead-letter
topic that takes whole any record the source topics accept.
"""

from __future__ import annotations

import pytest

from core.settings import ConfigError, KafkaSettings, parse_settings
from streams.kafka.admin import (
    DEAD_LETTER_HEADROOM_BYTES,
    PreparedTopics,
    Replication,
    topic_configs,
    worker_kafka,
)
from streams.kafka.topic_drift import _differs
from streams.topics import TopicNames

pytestmark = pytest.mark.unit

NAMES = TopicNames.with_prefix("t.")


def kafka(**values: object) -> KafkaSettings:
    return parse_settings({"kafka": values}).kafka


@pytest.mark.parametrize(
    ("brokers", "factor", "min_insync"), [(1, 1, 1), (2, 2, 1), (3, 3, 2), (5, 3, 2)]
)
def test_unset_replication_follows_the_cluster(brokers: int, factor: int, min_insync: int) -> None:
    assert Replication.of(kafka(), brokers) == Replication(factor, min_insync)


def test_set_replication_is_kept_and_min_insync_defaults_from_it() -> None:
    assert Replication.of(kafka(replication_factor=2), 5) == Replication(2, 1, explicit=True)
    assert Replication.of(kafka(replication_factor=5, min_insync_replicas=3), 5) == Replication(
        5, 3, explicit=True
    )


def test_more_in_sync_replicas_than_replicas_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="min_insync_replicas"):
        kafka(replication_factor=2, min_insync_replicas=3)
    with pytest.raises(ConfigError, match=r"min_insync_replicas = 2 .* cluster of 1 broker"):
        Replication.of(kafka(min_insync_replicas=2), 1)


def test_an_existing_topic_is_judged_by_its_own_replica_count() -> None:
    """A topic created with two replicas while a broker was down is not told to
    lower min.insync.replicas to 1 when the cluster is whole again, nor the reverse."""
    replication = Replication.of(kafka(), 3)
    assert replication.wanted_min_insync(kafka(), 3) == 2
    assert replication.wanted_min_insync(kafka(), 1) == 1
    assert replication.wanted_min_insync(kafka(min_insync_replicas=2), 3) == 2


def test_every_topic_gets_min_insync_and_the_dead_letter_topic_its_size() -> None:
    configs = topic_configs(NAMES, kafka(), Replication(3, 2), largest_record=8 * 1024 * 1024)
    assert {name: configs[name]["min.insync.replicas"] for name in NAMES.all()} == dict.fromkeys(
        NAMES.all(), "2"
    )
    assert configs[NAMES.dead_letters]["max.message.bytes"] == str(
        8 * 1024 * 1024 + DEAD_LETTER_HEADROOM_BYTES
    )
    assert configs[NAMES.clip_archives]["cleanup.policy"] == "compact"
    assert "min.insync.replicas" not in topic_configs(NAMES)[NAMES.messages]


def test_a_larger_dead_letter_limit_than_wanted_is_not_drift() -> None:
    assert not _differs("max.message.bytes", "16777216", "8404992")
    assert _differs("max.message.bytes", "1048588", "8404992")
    assert _differs("min.insync.replicas", "3", "2")  # exact: more is not "fine" here


def test_the_worker_producer_can_send_any_source_record_as_a_dead_letter() -> None:
    prepared = PreparedTopics({}, Replication(3, 2), 8 * 1024 * 1024, 1_048_588)
    resolved = worker_kafka(kafka(), prepared)
    assert resolved.max_request_bytes == 8 * 1024 * 1024 + DEAD_LETTER_HEADROOM_BYTES
    assert (resolved.replication_factor, resolved.min_insync_replicas) == (3, 2)
    small = PreparedTopics({}, Replication(1, 1), 1_048_588, 1_048_588)
    assert worker_kafka(kafka(max_request_bytes=4_000_000), small).max_request_bytes == 4_000_000
