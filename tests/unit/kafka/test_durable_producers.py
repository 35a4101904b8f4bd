"""Every producer of the service sends with acks=all and idempotence.

Why: on a replicated cluster a record acknowledged by the leader alone is
lost when that leader dies before a follower copied it, and a send retried
after a lost ack (a leader moving) is written twice without idempotence.
One helper builds every producer's settings; Faust's producer, which has no
setting for idempotence, gets them through a patch. A producer built any
other way in ``streams/`` fails the last test here.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from core.settings import parse_settings
from streams.kafka import faust_patches
from streams.kafka.producers import DURABLE_SENDS, producer_config

pytestmark = pytest.mark.unit

STREAMS = Path(__file__).resolve().parents[3] / "streams"


def test_the_helper_always_sends_with_acks_all_and_idempotence() -> None:
    config = producer_config(
        {"security_protocol": "SSL"}, client_id="compactor-replay", linger_ms=5
    )
    assert config == {
        "security_protocol": "SSL",
        "linger_ms": 5,
        "client_id": "compactor-replay",
        "acks": "all",
        "enable_idempotence": True,
    }
    with pytest.raises(ValueError, match="acks"):
        producer_config({}, client_id="x", acks=1)
    with pytest.raises(ValueError, match="enable_idempotence"):
        producer_config({}, client_id="x", enable_idempotence=False)


def test_every_producer_faust_builds_is_idempotent_with_acks_all() -> None:
    from faust.transport.drivers.aiokafka import Producer

    assert faust_patches.durable_producer()
    assert faust_patches.durable_producer()  # applying twice is a no-op
    outside = SimpleNamespace(app=SimpleNamespace(in_transaction=False))
    inside = SimpleNamespace(app=SimpleNamespace(in_transaction=True))
    for producer in (outside, inside):
        extra = Producer._settings_extra(producer)  # type: ignore[arg-type]
        assert {key: extra[key] for key in DURABLE_SENDS} == dict(DURABLE_SENDS)


def test_the_worker_app_asks_faust_for_acks_all_and_the_resolved_request_size() -> None:
    from streams.kafka.faust_app import create_app

    settings = parse_settings({"kafka": {"max_request_bytes": 8_404_992}})
    app = create_app(settings, "127.0.0.1:9092")
    assert app.conf.producer_acks == -1
    assert app.conf.producer_max_request_size == 8_404_992


def test_no_producer_in_streams_is_built_without_the_helper() -> None:
    built = []
    for path in STREAMS.rglob("*.py"):
        text = path.read_text()
        for match in re.finditer(r"AIOKafkaProducer\(", text):
            call = text[match.start() : match.start() + 400]
            built.append((path.relative_to(STREAMS.parent), "producer_config(" in call))
    assert built, "no producer found: the test no longer looks at the right place"
    assert [where for where, ok in built if not ok] == []
