"""``compactor dead-letters list|redrive`` on a real broker.

Promises: a re-driven record is the dead letter's key, value and headers (no
``dlq.*``) on its source partition, with ``compactor.redriven-from``; each
source is re-driven once, also when its dead letter is there twice, when the
command is repeated, when it stopped after any of its three steps, and when
it is killed -9 in the middle; ``--dry-run`` writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from core.settings import Settings, parse_settings
from streams.cli.dead_letter_commands import cmd_dead_letters, ledger_topic
from streams.cli.dead_letters import (
    REDRIVEN_FROM,
    DeadLetter,
    plan_redrive,
    read_dead_letters,
    read_ledger,
    read_topic,
    since_time,
)
from streams.cli.redrive import Redriver
from streams.dead_letter_headers import DeadLetterHeaders
from streams.kafka.admin import ensure_topics
from streams.topics import TopicNames

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PARTITIONS = 4
SIGNATURE = ("compactor-signature", b"v1=feedface")
T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


class Site:
    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.prefix = f"redrive.{uuid.uuid4().hex[:8]}."
        self.names = TopicNames.with_prefix(self.prefix)
        self.settings: Settings = parse_settings(
            {
                "kafka": {
                    "bootstrap_servers": bootstrap,
                    "topic_prefix": self.prefix,
                    "partitions": PARTITIONS,
                    "replication_factor": 1,
                }
            }
        )

    async def dead_letter(
        self,
        producer: AIOKafkaProducer,
        source_offset: int,
        *,
        error_type: str = "invalid_event",
        failed_at: datetime = T0,
        redacted: bool = False,
        source_topic: str | None = None,
    ) -> None:
        partition = source_offset % PARTITIONS
        meta = DeadLetterHeaders.model_validate(
            {
                "dlq.reason": f"{error_type}: role: wizard is not a role",
                "dlq.error_type": error_type,
                "dlq.source_topic": source_topic or self.names.messages,
                "dlq.source_partition": partition,
                "dlq.source_offset": source_offset,
                "dlq.failed_at": failed_at,
                "dlq.original_size": 20,
                "dlq.redacted": redacted,
            }
        )
        await producer.send_and_wait(
            self.names.dead_letters,
            None if redacted else f'{{"n": {source_offset}}}'.encode(),
            key=f"conv-{source_offset}".encode(),
            headers=[SIGNATURE, *meta.to_kafka()],
        )

    async def redriven(self) -> list[Any]:
        return await read_topic(self.bootstrap, self.names.messages)


@pytest.fixture
async def site(kafka_bootstrap: str) -> AsyncIterator[Site]:
    site = Site(kafka_bootstrap)
    await ensure_topics(kafka_bootstrap, site.names, partitions=PARTITIONS, replication_factor=1)
    yield site


async def fill(site: Site, count: int, **kinds: Any) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=site.bootstrap, acks="all")
    await producer.start()
    try:
        for offset in range(count):
            await site.dead_letter(producer, offset)
        await site.dead_letter(producer, 0)  # dead-lettered twice (at least once)
        await site.dead_letter(
            producer, 1000, error_type="oversized", failed_at=T0 + timedelta(days=1)
        )
        await site.dead_letter(producer, 1001, redacted=True)
    finally:
        await producer.stop()


def namespace(command: str, **values: Any) -> argparse.Namespace:
    base = {"reason": None, "since": None, "json": False, "dry_run": False}
    return argparse.Namespace(dead_letters_command=command, **{**base, **values})


def sources(records: Sequence[Any]) -> Counter[str]:
    return Counter(bytes(v).decode() for r in records for k, v in r.headers if k == REDRIVEN_FROM)


async def test_list_filters_by_reason_and_time(
    site: Site, capsys: pytest.CaptureFixture[str]
) -> None:
    await fill(site, 3)
    assert await cmd_dead_letters(site.settings, namespace("list")) == 0
    listed = capsys.readouterr().out
    assert "5 dead letters" in listed  # 3 + oversized + redacted; the duplicate once
    assert await cmd_dead_letters(site.settings, namespace("list", reason="oversized")) == 0
    assert f"{site.names.messages}:0:1000" in capsys.readouterr().out
    since = (T0 + timedelta(hours=12)).isoformat()
    assert await cmd_dead_letters(site.settings, namespace("list", since=since, json=True)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and '"error_type": "oversized"' in lines[0]
    assert since_time("2h", T0) == T0 - timedelta(hours=2)


async def test_redrive_sends_each_once_as_it_came_and_a_repeat_sends_nothing(
    site: Site, capsys: pytest.CaptureFixture[str]
) -> None:
    await fill(site, 6)
    dry = namespace("redrive", dry_run=True, reason="invalid_event")
    assert await cmd_dead_letters(site.settings, dry) == 0
    assert "dry run: 6 to re-drive" in capsys.readouterr().out
    assert await site.redriven() == []
    admin = AIOKafkaAdminClient(bootstrap_servers=site.bootstrap)
    await admin.start()
    try:
        assert ledger_topic(site.settings) not in await admin.list_topics()  # wrote nothing
    finally:
        await admin.close()

    assert await cmd_dead_letters(site.settings, namespace("redrive")) == 0
    out = capsys.readouterr().out
    assert "7 re-driven" in out and "1 not re-drivable" in out and "redacted" in out
    records = await site.redriven()
    assert sum(sources(records).values()) == 7 and set(sources(records).values()) == {1}
    first = next(r for r in records if r.key == b"conv-5")
    assert first.partition == 5 % PARTITIONS and first.value == b'{"n": 5}'
    assert [k for k, _ in first.headers] == [SIGNATURE[0], REDRIVEN_FROM]  # no dlq.*
    assert dict(first.headers)[SIGNATURE[0]] == SIGNATURE[1]

    assert await cmd_dead_letters(site.settings, namespace("redrive")) == 0
    assert "0 re-driven, 0 found re-driven by an interrupted run, 7 re-driven before" in (
        capsys.readouterr().out
    )
    assert len(await site.redriven()) == 7


async def test_only_the_messages_topics_dead_letters_are_re_driven(
    site: Site, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dead letter read from the erase-requests or control topic is refused and
    listed with the reason: a redrive runs under the operator's principal, which
    may write the erase topic, and must never republish an erase request."""
    producer = AIOKafkaProducer(bootstrap_servers=site.bootstrap, acks="all")
    await producer.start()
    try:
        await site.dead_letter(producer, 1, source_topic=site.names.erasures)
        await site.dead_letter(producer, 2, source_topic=site.names.control)
        await site.dead_letter(producer, 3)
    finally:
        await producer.stop()
    assert await cmd_dead_letters(site.settings, namespace("list")) == 0
    listed = capsys.readouterr().out
    assert listed.count("not re-drivable: source topic") == 2, listed
    assert await cmd_dead_letters(site.settings, namespace("redrive")) == 0
    out = capsys.readouterr().out
    for topic in (site.names.erasures, site.names.control):
        assert f"not re-driven: {topic}:" in out and "only producers' messages" in out, out
    assert "1 re-driven" in out and "2 not re-drivable" in out, out
    assert [r.key for r in await site.redriven()] == [b"conv-3"]
    for topic in (site.names.erasures, site.names.control):
        assert await read_topic(site.bootstrap, topic) == []


class Crash(Exception):
    """Stands for the process dying at that step (everything before it was acked)."""


@pytest.mark.parametrize("step", ["intent", "sent", "done"])
async def test_a_redrive_stopped_after_any_step_is_completed_once_by_the_next(
    site: Site, step: str
) -> None:
    await fill(site, 250)  # three rounds of CHUNK
    letters, _ = await read_dead_letters(site.bootstrap, site.names.dead_letters)
    ledger_name = ledger_topic(site.settings)
    await ensure_topics_and_ledger(site)
    rounds = 0

    async def crash_in_round_two(at: str, chunk: Sequence[DeadLetter]) -> None:
        nonlocal rounds
        if at == "intent":
            rounds += 1
        if rounds == 2 and at == step:
            raise Crash

    plan = plan_redrive(letters, {}, site.names.messages)
    with pytest.raises(Crash):
        await Redriver(site.bootstrap, ledger_name, progress=crash_in_round_two).run(plan)
    ledger = await read_ledger(site.bootstrap, ledger_name)
    again = plan_redrive(letters, ledger, site.names.messages)
    result = await Redriver(site.bootstrap, ledger_name).run(again)
    counts = sources(await site.redriven())
    assert len(counts) == 251 and set(counts.values()) == {1}
    if step == "sent":  # the second round was sent and not recorded: found, not re-sent
        assert len(result.found_sent) == 100
    final = await read_ledger(site.bootstrap, ledger_name)
    assert {e.state for e in final.values()} == {"done"} and len(final) == 251


async def ensure_topics_and_ledger(site: Site) -> None:
    from streams.cli.dead_letters import ensure_ledger

    await ensure_ledger(site.bootstrap, ledger_topic(site.settings), site.settings.kafka)


async def test_a_redrive_killed_in_the_middle_and_run_again_sends_each_once(
    site: Site, tmp_path: Path
) -> None:
    await fill(site, 400)
    config = tmp_path / "config.toml"
    config.write_text(
        f'[kafka]\nbootstrap_servers = "{site.bootstrap}"\ntopic_prefix = "{site.prefix}"\n'
        f"partitions = {PARTITIONS}\nreplication_factor = 1\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    command = [
        sys.executable,
        "-m",
        "streams.cli",
        "--config",
        str(config),
        "dead-letters",
        "redrive",
    ]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)  # noqa: ASYNC220
    assert first.stdout is not None
    line = ""
    while not line.startswith("re-driven "):  # the first round is done
        line = await asyncio.to_thread(first.stdout.readline)
        assert line, "the redrive ended before re-driving anything"
    first.send_signal(signal.SIGKILL)
    await asyncio.to_thread(first.wait, 30)
    done = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, env=env, timeout=180
    )
    assert done.returncode == 0, done.stderr
    counts = sources(await site.redriven())
    assert len(counts) == 401 and set(counts.values()) == {1}, Counter(counts.values())
    summary = done.stdout.strip().splitlines()[-1]
    assert "re-driven before" in summary and "1 not re-drivable" in summary
    assert not summary.startswith("0 re-driven, 0 found"), "the kill interrupted nothing"
