"""The Kafka-facing commands against a real broker, and ``dev up/status/down`` for real.

Why: ``replay`` is how test data and demos reach the worker, so its keying
(one conversation, one partition, in order) and its topic layout
(co-partitioned) must be what the worker expects; ``tail`` must show each
compaction once although the topic is at-least-once; and ``dev up`` must
really leave a working Kafka and PostgreSQL behind that every other command
finds, and ``dev down`` must really leave nothing running.

``replay``/``tail``/``topics`` run in-process (in a thread, as ``main`` runs
its own event loop); the dev-stack tests run the CLI as subprocesses with a
clean environment, as a developer would.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import ConsumerRecord, TopicPartition

from core.domain.messages import ConversationMessage, ToolCall
from devtools import devstack
from streams import cli
from streams.events import BatchInfo, ClipArchiveEvent, EraseRequest, MessageEvent
from streams.kafka.admin import describe_topic_configs
from streams.kafka.topic_drift import config_drift
from streams.stack_state import DEV_STATE_DIR_ENV, pid_alive, read_state
from streams.topics import TopicNames
from tests.conftest import require_local_kafka_tools

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PARTITIONS = 3  # not the broker's default (4): proves the configured count is used
T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)


# --------------------------------------------------------------------------- helpers


@dataclass
class Project:
    """A config file with a topic prefix of its own, so tests never share topics."""

    config: Path
    topics: TopicNames

    def argv(self, *args: str) -> list[str]:
        return ["--config", str(self.config), *args]


@pytest.fixture
def project(
    tmp_path: Path, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Project]:
    prefix = f"t{uuid.uuid4().hex[:10]}."
    config = tmp_path / "config.toml"
    config.write_text(f'[kafka]\ntopic_prefix = "{prefix}"\npartitions = {PARTITIONS}\n')
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    yield Project(config, TopicNames.with_prefix(prefix))


async def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(cli.main, argv)
    out, err = capsys.readouterr()
    return code, out, err


def message_events(conversations: int = 3, per_conversation: int = 7) -> list[MessageEvent]:
    """Interleaved conversations, as a platform would publish them."""
    events = []
    for i in range(per_conversation):
        for c in range(conversations):
            conversation = f"conv-{c}"
            tool = i == 3
            events.append(
                MessageEvent(
                    message_id=f"{conversation}-{i:03d}",
                    conversation_id=conversation,
                    role="assistant" if i % 2 else "user",
                    content=f"message {i} of {conversation}: is the deploy fixed?",
                    tool_calls=(ToolCall(id=f"call-{c}-{i}", name="kubectl", arguments={"n": i}),)
                    if tool
                    else None,
                    created_at=T0 + timedelta(minutes=i),
                    token_count=12 if i == 0 else None,
                )
            )
    return events


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


async def consume(bootstrap: str, topic: str, expected: int) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of ``topic`` (waiting for ``expected``, then a moment for extras)."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest"
    )
    await consumer.start()
    records: list[ConsumerRecord[bytes, bytes]] = []
    try:
        deadline = asyncio.get_running_loop().time() + 30
        settle = 1.0
        while asyncio.get_running_loop().time() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for batch in batches.values():
                records.extend(batch)
            if len(records) >= expected:
                settle -= 0.5
                if settle <= 0:
                    break
    finally:
        await consumer.stop()
    return records


async def describe(bootstrap: str, topics: list[str]) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        present = [t for t in topics if t in existing]
        described = await admin.describe_topics(present) if present else []
    finally:
        await admin.close()
    return {d["topic"]: len(d["partitions"]) for d in described}


def clip_event(conversation: str, compaction: str, generation: int = 0) -> ClipArchiveEvent:
    return ClipArchiveEvent(
        compaction_id=compaction,
        conversation_id=conversation,
        generation=generation,
        clip_archive=ConversationMessage(
            id=f"clip-archive-{compaction}",
            conversation_id=conversation,
            role="system",
            content="[Context Summary — 3 messages compressed]",
            created_at=T0,
        ),
        kept_message_ids=("m4", "m5"),
        compressed_message_ids=("m1", "m2", "m3"),
        batches=(
            BatchInfo(
                id=f"batch-{compaction}",
                label=f"compaction-batch-{conversation}-1700000000000",
                depth=0,
                start_time=T0,
                end_time=T0 + timedelta(minutes=3),
                message_count=3,
            ),
        ),
        tokens_before=1200,
        tokens_after=300,
        created_at=T0 + timedelta(hours=1),
    )


async def produce(bootstrap: str, topic: str, records: list[tuple[str, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, value, key=key.encode())
    finally:
        await producer.stop()


# --------------------------------------------------------------------------- replay


async def test_replay_publishes_every_event_keyed_by_conversation_on_copartitioned_topics(
    project: Project, kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = message_events()
    file = write_jsonl(tmp_path / "in.jsonl", [e.model_dump_json() for e in events] + [""])

    code, out, err = await run_cli(capsys, project.argv("replay", str(file)))

    assert code == 0, err
    assert f"published 21 message events to {project.topics.messages} (3 conversations)" in out
    assert "21/21" in err  # the progress report (not a TTY here: plain lines)
    topics = [
        project.topics.messages,
        project.topics.commands,
        project.topics.control,
        project.topics.clip_archives,
        project.topics.dead_letters,
    ]
    assert await describe(kafka_bootstrap, topics) == dict.fromkeys(topics, PARTITIONS)

    records = await consume(kafka_bootstrap, project.topics.messages, len(events))
    assert len(records) == len(events)
    partitions_of: dict[str, set[int]] = defaultdict(set)
    order_of: dict[str, list[str]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        assert record.key is not None and record.value is not None
        event = MessageEvent.model_validate_json(record.value)
        assert record.key.decode() == event.conversation_id
        partitions_of[event.conversation_id].add(record.partition)
        order_of[event.conversation_id].append(event.message_id)
    assert all(len(p) == 1 for p in partitions_of.values()), partitions_of
    sent_order: dict[str, list[str]] = defaultdict(list)
    for event in events:
        sent_order[event.conversation_id].append(event.message_id)
    assert order_of == sent_order  # per conversation, in file order
    received = sorted(
        (MessageEvent.model_validate_json(r.value or b"") for r in records),
        key=lambda e: e.message_id,
    )
    assert received == sorted(events, key=lambda e: e.message_id)


async def test_erase_publishes_one_erase_request_keyed_by_the_conversation(
    project: Project, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = await run_cli(capsys, project.argv("topics"))
    assert code == 0, err
    configs = await describe_topic_configs(kafka_bootstrap, project.topics.all())
    assert configs[project.topics.clip_archives]["cleanup.policy"] == "compact"
    assert configs[project.topics.messages]["retention.ms"] == str(168 * 3_600_000)
    assert configs[project.topics.erase_completions]["cleanup.policy"] == "delete"
    argv = ["erase", "conv-to-forget", "--reason", "ticket 7", "--requester", "dpo"]
    code, out, err = await run_cli(capsys, project.argv(*argv))
    assert code == 0, err
    assert "erase of 'conv-to-forget' requested" in out
    (record,) = await consume(kafka_bootstrap, project.topics.erasures, 1)
    assert record.key == b"conv-to-forget"
    request = EraseRequest.model_validate_json(record.value or b"")
    assert request.conversation_id == "conv-to-forget"
    assert (request.requester, request.reason) == ("dpo", "ticket 7")
    assert set(request.messages_end_offsets) == set(range(PARTITIONS))
    code, _, err = await run_cli(capsys, project.argv("erase", "x" * 300, "--reason", "r"))
    assert code != 0 and "1 to 256 characters" in err
    # --reason is required; --wait with no worker to answer: exit 3 after --timeout.
    with pytest.raises(SystemExit):
        await run_cli(capsys, project.argv("erase", "conv-to-forget"))
    code, _, err = await run_cli(
        capsys, project.argv("erase", "conv-2", "--reason", "r", "--wait", "--timeout", "1")
    )
    assert code == 3 and "no erase completion" in err


async def test_topics_reports_and_applies_config_drift_of_existing_topics(
    project: Project, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = await run_cli(capsys, project.argv("topics"))
    assert code == 0, err
    text = project.config.read_text()
    project.config.write_text(text + "messages_retention_hours = 2.0\n")
    code, out, err = await run_cli(capsys, project.argv("topics"))
    assert code == 1 and "--apply-configs" in err
    assert f"{project.topics.messages}: retention.ms differs: 604800000 -> 7200000" in out
    code, out, err = await run_cli(capsys, project.argv("topics", "--apply-configs"))
    assert code == 0, err
    deadline = asyncio.get_running_loop().time() + 30  # the brokers apply it shortly
    while True:
        configs = await describe_topic_configs(kafka_bootstrap, [project.topics.messages])
        messages = configs[project.topics.messages]
        if messages["retention.ms"] == "7200000" or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.2)
    assert (messages["retention.ms"], messages["segment.ms"]) == ("7200000", "7200000")
    assert messages["cleanup.policy"] == "delete"
    code, _, err = await run_cli(capsys, project.argv("topics"))
    assert code == 0, err


async def test_topics_sizes_the_dead_letter_topic_and_reports_replication_drift(
    project: Project, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The dead-letter topic follows the largest record the source topics accept;
    a replication factor the topics lack is reported (a reassignment, never applied)."""
    code, out, err = await run_cli(capsys, project.argv("topics"))
    assert code == 0, err
    assert "1 replica(s), min.insync.replicas 1" in out  # one broker: the defaults fit it
    names = project.topics
    configs = await describe_topic_configs(kafka_bootstrap, names.all())
    default_limit = int(configs[names.messages]["max.message.bytes"] or 0)
    assert configs[names.dead_letters]["max.message.bytes"] == str(default_limit + 16 * 1024)
    assert {configs[name]["min.insync.replicas"] for name in names.all()} == {"1"}

    await config_drift(
        kafka_bootstrap, {names.messages: {"max.message.bytes": str(8 * 1024 * 1024)}}, apply=True
    )
    wanted = str(8 * 1024 * 1024 + 16 * 1024)

    deadline = asyncio.get_running_loop().time() + 30  # the brokers apply it shortly
    while True:
        code, out, _ = await run_cli(capsys, project.argv("topics"))
        if code == 1 or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.2)
    assert code == 1
    assert (
        f"{names.dead_letters}: max.message.bytes differs: {default_limit + 16 * 1024} -> {wanted}"
        in out
    )
    code, out, err = await run_cli(capsys, project.argv("topics", "--apply-configs"))
    assert code == 0, err

    project.config.write_text(project.config.read_text() + "replication_factor = 2\n")
    code, out, err = await run_cli(capsys, project.argv("topics"))
    assert code == 1
    assert f"{names.messages}: replication factor differs: 1 -> 2" in out
    assert "--apply-configs does not change it" in out


async def test_replay_refuses_a_bad_file_naming_file_line_and_field(
    project: Project, kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = [e.model_dump_json() for e in message_events(1, 3)]
    bad_role = json.loads(good[1]) | {"role": "robot"}
    no_time = {k: v for k, v in json.loads(good[2]).items() if k != "created_at"}
    file = write_jsonl(
        tmp_path / "bad.jsonl",
        [good[0], json.dumps(bad_role), "", json.dumps(no_time), "{not json"],
    )

    code, out, err = await run_cli(capsys, project.argv("replay", str(file)))

    assert code == 1
    assert f"{file}:2: role:" in err
    assert f"{file}:4: created_at: Field required" in err
    assert f"{file}:5: " in err
    assert "3 invalid line(s), nothing published" in err
    assert "published" not in out
    assert await describe(kafka_bootstrap, [project.topics.messages]) == {}


async def test_replay_skip_invalid_publishes_the_rest_and_counts(
    project: Project, kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = [e.model_dump_json() for e in message_events(2, 2)]
    file = write_jsonl(tmp_path / "mixed.jsonl", [good[0], "[]", good[1], good[2], "{}", good[3]])

    code, out, err = await run_cli(capsys, project.argv("replay", "--skip-invalid", str(file)))

    assert code == 0, err
    assert f"skipping {file}:2:" in err
    assert f"skipping {file}:5:" in err
    assert (
        f"published 4 message events to {project.topics.messages} (2 conversations), "
        "skipped 2 invalid line(s)"
    ) in out
    assert len(await consume(kafka_bootstrap, project.topics.messages, 4)) == 4


async def test_replay_rate_spaces_the_sends(
    project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = message_events(1, 6)
    file = write_jsonl(tmp_path / "slow.jsonl", [e.model_dump_json() for e in events])
    loop = asyncio.get_running_loop()
    started = loop.time()

    code, _, err = await run_cli(capsys, project.argv("replay", "--rate", "10", str(file)))

    assert code == 0, err
    assert loop.time() - started >= 0.5  # 6 messages at 10/s: the last leaves after 0.5 s


# --------------------------------------------------------------------------- tail


async def test_tail_prints_each_compaction_once(
    project: Project, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = await run_cli(capsys, project.argv("topics"))
    assert code == 0, err
    assert re.search(
        rf"^{re.escape(project.topics.clip_archives)} +{PARTITIONS} partitions", out, re.M
    )

    first = clip_event("conv-a", "compaction-1")
    second = clip_event("conv-b", "compaction-2", generation=1)
    await produce(
        kafka_bootstrap,
        project.topics.clip_archives,
        [
            ("conv-a", first.model_dump_json().encode()),
            ("conv-a", first.model_dump_json().encode()),  # at-least-once redelivery
            ("conv-b", b"not an event"),
            ("conv-b", second.model_dump_json().encode()),
        ],
    )

    code, out, err = await run_cli(
        capsys, project.argv("tail", "--from-beginning", "--timeout", "3")
    )
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 2, out
    assert sorted(line.split()[2] for line in lines) == ["conv-a", "conv-b"]
    by_conversation = {line.split()[2]: line for line in lines}
    assert "compaction compaction-1 (gen 0)" in by_conversation["conv-a"]
    assert "3 messages compressed" in by_conversation["conv-a"]
    assert "tokens 1200 → 300" in by_conversation["conv-a"]
    assert "1 batches (depth 0)" in by_conversation["conv-a"]
    assert "not a ClipArchiveEvent" in err

    code, out, err = await run_cli(
        capsys, project.argv("tail", "--from-beginning", "--json", "--max", "2", "--timeout", "10")
    )
    assert code == 0, err
    shown = [ClipArchiveEvent.model_validate_json(line) for line in out.splitlines()]
    assert sorted(shown, key=lambda e: e.compaction_id) == [first, second]

    code, out, _ = await run_cli(
        capsys,
        project.argv("tail", "--from-beginning", "--conversation", "conv-b", "--timeout", "2"),
    )
    assert code == 0
    assert [line.split()[2] for line in out.splitlines()] == ["conv-b"]

    code, out, err = await run_cli(
        capsys, project.argv("tail", "--from-beginning", "--max", "3", "--timeout", "2")
    )
    assert code == 1
    assert "2 of 3 events" in err


async def test_tail_follows_new_events(
    project: Project, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = await run_cli(capsys, project.argv("topics"))
    assert code == 0, err
    await produce(
        kafka_bootstrap,
        project.topics.clip_archives,
        [("old", clip_event("old", "before-tail").model_dump_json().encode())],
    )
    capsys.readouterr()
    follower = asyncio.create_task(
        asyncio.to_thread(cli.main, project.argv("tail", "--max", "1", "--timeout", "30"))
    )
    # tail only shows what arrives after it started, so keep publishing until it has.
    for n in range(60):
        if follower.done():
            break
        event = clip_event("live", f"live-{n}")
        await produce(
            kafka_bootstrap,
            project.topics.clip_archives,
            [("live", event.model_dump_json().encode())],
        )
        await asyncio.sleep(0.5)
    assert await follower == 0
    out = capsys.readouterr().out
    assert " live compaction live-" in out
    assert "before-tail" not in out


async def test_kafka_commands_without_a_broker_say_how_to_get_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv(DEV_STATE_DIR_ENV, str(tmp_path / "no-stack"))
    config = tmp_path / "config.toml"
    config.write_text("")
    code, _, err = await run_cli(capsys, ["--config", str(config), "tail", "--timeout", "1"])
    assert code == 2
    assert "compactor dev up" in err

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    code, _, err = await run_cli(capsys, ["--config", str(config), "topics"])
    assert code == 1
    assert "Kafka at 127.0.0.1:1 does not answer" in err


# --------------------------------------------------------------------------- dev stack


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a developer who configured nothing."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in {
            "KAFKA_BOOTSTRAP_SERVERS",
            "POSTGRES_DSN",
            "COMPACTOR_CONFIG",
            DEV_STATE_DIR_ENV,
        }
    }
    env.update(extra)
    return env


async def compactor(
    *args: str, env: dict[str, str], cwd: Path, seconds: float = 200
) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "streams.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=seconds,
        check=False,
    )


@pytest.fixture
async def dev_state(tmp_path: Path) -> AsyncIterator[Path]:
    """A state dir whose stack is always stopped at the end, whatever the test did."""
    state = tmp_path / "dev-state"
    try:
        yield state
    finally:
        if read_state(state) is not None:
            await devstack.down(state, say=lambda _: None)


async def test_dev_up_status_down_with_nothing_configured(tmp_path: Path, dev_state: Path) -> None:
    require_local_kafka_tools()
    env = clean_env()

    up = await compactor("dev", "--state-dir", str(dev_state), "up", env=env, cwd=tmp_path)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "dev stack up" in up.stdout
    assert "export KAFKA_BOOTSTRAP_SERVERS=" in up.stdout
    state = read_state(dev_state)
    assert state is not None and state.kafka_bootstrap and state.postgres_dsn
    assert set(state.pids) == {"kafka", "postgres"}
    assert all(pid_alive(pid) for pid in state.pids.values())
    broker_pid = int((dev_state / "kafka" / "broker.pid").read_text())
    server_pid = int(
        (dev_state / "postgres" / "postgres" / "postmaster.pid").read_text().splitlines()[0]
    )
    assert pid_alive(broker_pid) and pid_alive(server_pid)

    status = await compactor("dev", "--state-dir", str(dev_state), "status", env=env, cwd=tmp_path)
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.count("answering") == 2 and "NOT answering" not in status.stdout

    again = await compactor("dev", "--state-dir", str(dev_state), "up", env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already up" in again.stdout
    assert read_state(dev_state) == state

    # Every other command finds the stack by itself: no env, no config.
    found = clean_env(**{DEV_STATE_DIR_ENV: str(dev_state)})
    migrate = await compactor("migrate", env=found, cwd=tmp_path)
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    assert str(dev_state / "postgres") in migrate.stdout  # the dev PostgreSQL, not a new one
    assert not (tmp_path / ".state").exists()
    topics = await compactor("topics", env=found, cwd=tmp_path)
    assert topics.returncode == 0, topics.stdout + topics.stderr
    assert state.kafka_bootstrap in topics.stdout

    down = await compactor("dev", "--state-dir", str(dev_state), "down", env=env, cwd=tmp_path)
    assert down.returncode == 0, down.stdout + down.stderr
    assert read_state(dev_state) is None
    for pid in [*state.pids.values(), broker_pid, server_pid]:
        assert not pid_alive(pid), f"pid {pid} still runs after dev down"

    after = await compactor("dev", "--state-dir", str(dev_state), "status", env=env, cwd=tmp_path)
    assert after.returncode == 1
    assert "NOT answering" in after.stdout
    again_down = await compactor(
        "dev", "--state-dir", str(dev_state), "down", env=env, cwd=tmp_path
    )
    assert again_down.returncode == 0
    assert "nothing to stop" in again_down.stdout


async def test_dev_up_only_checks_configured_services(
    tmp_path: Path, dev_state: Path, kafka_bootstrap: str, pg_database: str
) -> None:
    env = clean_env(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, POSTGRES_DSN=pg_database)

    up = await compactor("dev", "--state-dir", str(dev_state), "up", env=env, cwd=tmp_path)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "configured ($KAFKA_BOOTSTRAP_SERVERS)" in up.stdout
    assert "configured ($POSTGRES_DSN)" in up.stdout
    assert "starting" not in up.stdout
    assert read_state(dev_state) is None  # nothing started, nothing to stop
    status = await compactor("dev", "--state-dir", str(dev_state), "status", env=env, cwd=tmp_path)
    assert status.returncode == 0, status.stdout + status.stderr

    dead = clean_env(
        KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap,
        POSTGRES_DSN="postgresql://nobody:secret@127.0.0.1:1/none",
    )
    refused = await compactor("dev", "--state-dir", str(dev_state), "up", env=dead, cwd=tmp_path)
    assert refused.returncode == 1
    assert "PostgreSQL at postgresql://nobody:***@127.0.0.1:1/none" in refused.stderr
    assert "does not answer" in refused.stderr
    assert "secret" not in refused.stderr


async def test_dev_up_restarts_a_killed_broker_on_the_same_address_with_its_data(
    tmp_path: Path, dev_state: Path
) -> None:
    """Workers keep the bootstrap address they were given: after a crash, the broker
    must come back there, with the topics and committed offsets it had."""
    require_local_kafka_tools()
    env = clean_env()
    up = await compactor("dev", "--state-dir", str(dev_state), "up", env=env, cwd=tmp_path)
    assert up.returncode == 0, up.stdout + up.stderr
    before = read_state(dev_state)
    assert before is not None and before.kafka_bootstrap
    bootstrap = before.kafka_bootstrap
    topic, group = f"t{uuid.uuid4().hex[:10]}.survivor", f"g{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 2, 1)])
    finally:
        await admin.close()
    await produce(bootstrap, topic, [("k", b"before the crash")])
    [record] = await consume(bootstrap, topic, 1)
    committer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await committer.start()
    try:
        partition = TopicPartition(topic, record.partition)
        committer.assign([partition])
        await committer.commit({partition: record.offset + 1})
    finally:
        await committer.stop()

    broker_pid = int((dev_state / "kafka" / "broker.pid").read_text())
    os.kill(broker_pid, signal.SIGKILL)
    for _ in range(300):  # its launcher notices and exits: the recorded pid is dead
        if not pid_alive(broker_pid) and not pid_alive(before.pids["kafka"]):
            break
        await asyncio.sleep(0.1)
    assert not pid_alive(before.pids["kafka"])

    again = await compactor("dev", "--state-dir", str(dev_state), "up", env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    after = read_state(dev_state)
    assert after is not None
    assert after.kafka_bootstrap == bootstrap
    assert "as before" in again.stdout and "moved" not in again.stdout
    assert after.pids["kafka"] != before.pids["kafka"]
    assert (after.postgres_dsn, after.pids["postgres"]) == (
        before.postgres_dsn,
        before.pids["postgres"],
    )
    assert await describe(bootstrap, [topic]) == {topic: 2}
    assert [r.value for r in await consume(bootstrap, topic, 1)] == [b"before the crash"]
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await reader.start()
    try:
        assert await reader.committed(partition) == record.offset + 1
    finally:
        await reader.stop()
