"""The service over a broker that requires TLS and SASL (SCRAM), as a platform runs one.

Why: ``[kafka].security_protocol`` is only worth something if every client
honours it: the worker's Faust consumers and producers, ``topics``, ``replay``
and ``tail``. One local broker (``devtools.localstack.SecureBroker``: a CA
generated for the session, a SASL_SSL listener with PLAIN and SCRAM users and
an SSL listener requiring client certificates) carries a conversation from
``replay`` through a worker subprocess to a clip-archive read back by
``tail``; the rest checks that every wrong setting fails with a message that
names the problem and never the password.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from devtools.localstack import KafkaBroker, SecureBroker, start_kafka
from streams import cli
from streams.events import MessageEvent
from streams.kafka.probe import broker_problem
from streams.kafka.security import PLAINTEXT, KafkaSecurity
from streams.topics import TopicNames
from tests.conftest import require_local_kafka_tools
from tests.support.worker import WorkerProcess, render_toml, terminate_all

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PARTITIONS = 2
T0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KafkaBroker, SecureBroker]]:
    require_local_kafka_tools()
    root = tmp_path_factory.mktemp("kafka-secure")
    setup = SecureBroker.create(root / "tls")
    with start_kafka(root / "kafka", secure=setup, num_partitions=PARTITIONS) as broker:
        yield broker, setup


def _config(path: Path, prefix: str, setup: SecureBroker, **kafka: str) -> Path:
    values = {
        "topic_prefix": prefix,
        "partitions": PARTITIONS,
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "ssl_cafile": str(setup.ca.cert),
        **kafka,
    }
    path.write_text(render_toml({"kafka": values}))
    return path


async def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(cli.main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _transcript(path: Path, conversation: str, count: int = 16) -> Path:
    words = "the rollout of payments-api stalled at two of six pods after the deploy".split()
    lines = []
    for i in range(count):
        text = f"step {i}: " + " ".join(words[(i + j) % len(words)] for j in range(60))
        event = MessageEvent(
            message_id=f"{conversation}-{i:03d}",
            conversation_id=conversation,
            role="assistant" if i % 2 else "user",
            content=text,
            created_at=T0 + timedelta(minutes=i),
        )
        lines.append(event.model_dump_json())
    path.write_text("\n".join(lines) + "\n")
    return path


def test_probe_names_each_wrong_setting(secure: tuple[KafkaBroker, SecureBroker]) -> None:
    broker, setup = secure
    sasl = broker.bootstrap_servers
    assert broker_problem(sasl, 3.0, setup.client_security()) is None
    assert broker_problem(sasl, 3.0, setup.client_security("SCRAM-SHA-256")) is None
    assert broker_problem(sasl, 3.0, setup.client_security("PLAIN")) is None
    wrong = broker_problem(sasl, 3.0, setup.client_security(password="not-the-password"))
    assert wrong is not None and "refused the SASL login" in wrong
    assert "invalid credentials" in wrong and "not-the-password" not in wrong
    plaintext = broker_problem(sasl, 3.0, PLAINTEXT)
    assert plaintext is not None and "speaks TLS" in plaintext
    no_sasl = broker_problem(sasl, 3.0, KafkaSecurity("SSL", setup.context()))
    assert no_sasl is not None and "SASL" in no_sasl
    untrusted = KafkaSecurity(
        "SASL_SSL", ssl.create_default_context(), "SCRAM-SHA-512", setup.username, None
    )
    problem = broker_problem(sasl, 3.0, untrusted)
    assert problem is not None and "certificate not trusted" in problem
    # The SSL listener wants a client certificate signed by the CA.
    mtls = broker.ssl_bootstrap_servers
    assert mtls is not None
    with_cert = KafkaSecurity("SSL", setup.context(client_certificate=True))
    assert broker_problem(mtls, 3.0, with_cert) is None
    without = broker_problem(mtls, 3.0, KafkaSecurity("SSL", setup.context()))
    assert without is not None and "client certificate" in without


async def test_commands_fail_clearly_with_wrong_credentials_or_protocol(
    secure: tuple[KafkaBroker, SecureBroker],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    broker, setup = secure
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", broker.bootstrap_servers)
    monkeypatch.setenv("KAFKA_SASL_USERNAME", setup.username)
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "wrong-password-123")
    config = _config(tmp_path / "config.toml", "wrong.", setup)
    code, _, err = await run_cli(capsys, "--config", str(config), "topics")
    assert code == 1, err
    assert "refused the SASL login" in err and "wrong-password-123" not in err
    plain = tmp_path / "plain.toml"
    plain.write_text('[kafka]\ntopic_prefix = "plain."\n')
    code, _, err = await run_cli(capsys, "--config", str(plain), "tail", "--max", "1")
    assert code == 1 and "speaks TLS" in err and "security_protocol" in err, err
    monkeypatch.delenv("KAFKA_SASL_PASSWORD")
    code, _, err = await run_cli(capsys, "--config", str(config), "topics")
    assert code == 2 and "KAFKA_SASL_PASSWORD" in err, err


async def test_worker_replay_tail_and_topics_over_sasl_ssl_scram(
    secure: tuple[KafkaBroker, SecureBroker],
    tmp_path: Path,
    pg_database: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    broker, setup = secure
    prefix = f"s{uuid.uuid4().hex[:8]}."
    names = TopicNames.with_prefix(prefix)
    env = {"KAFKA_SASL_USERNAME": setup.username, "KAFKA_SASL_PASSWORD": setup.password}
    for name, value in {**env, "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers}.items():
        monkeypatch.setenv(name, value)
    config = _config(tmp_path / "config.toml", prefix, setup)

    code, out, err = await run_cli(capsys, "--config", str(config), "topics")
    assert code == 0, err
    assert names.messages in out and "co-partitioned" in out

    sections = {
        "summarization": {"provider": "extractive", "keep_recent": 2, "chunk_size": 4},
        "budget": {"context_budget": 0.5, "model_max_tokens": 2000},
        "kafka": {
            "topic_prefix": prefix,
            "partitions": PARTITIONS,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-256",  # the worker with the other SCRAM
            "ssl_cafile": str(setup.ca.cert),
        },
        "service": {"app_id": f"secure-{prefix[:-1]}", "store": "memory://"},
    }
    worker = WorkerProcess(
        tmp_path,
        "worker",
        bootstrap=broker.bootstrap_servers,
        dsn=pg_database,
        config=sections,
        env=env,
    ).start()
    try:
        await worker.wait_ready(names.messages, timeout=90)
        transcript = _transcript(tmp_path / "chat.jsonl", "secure-conv")
        code, out, err = await run_cli(capsys, "--config", str(config), "replay", str(transcript))
        assert code == 0, err
        assert "published 16 message events" in out
        code, out, err = await run_cli(
            capsys,
            "--config",
            str(config),
            "tail",
            "--from-beginning",
            "--max",
            "1",
            "--timeout",
            "60",
        )
        assert code == 0, f"{err}\n{worker.log_tail()}"
        assert "secure-conv" in out and "messages compressed" in out
        conn = await asyncpg.connect(pg_database)
        try:
            stored = await conn.fetchval(
                "SELECT count(*) FROM compactions WHERE conversation_id = 'secure-conv'"
            )
        finally:
            await conn.close()
        assert stored >= 1
    finally:
        await asyncio.to_thread(terminate_all, [worker])
    assert setup.password not in worker.log_text()


async def test_a_worker_with_a_wrong_password_exits_saying_so(
    secure: tuple[KafkaBroker, SecureBroker], tmp_path: Path, pg_database: str
) -> None:
    broker, setup = secure
    sections = {
        "kafka": {
            "security_protocol": "SASL_SSL",
            "ssl_cafile": str(setup.ca.cert),
            "topic_prefix": "nope.",
        }
    }
    worker = WorkerProcess(
        tmp_path,
        "refused",
        bootstrap=broker.bootstrap_servers,
        dsn=pg_database,
        config=sections,
        env={"KAFKA_SASL_USERNAME": setup.username, "KAFKA_SASL_PASSWORD": "bad-password-456"},
    ).start()
    assert worker.process is not None
    with contextlib.suppress(subprocess.TimeoutExpired):
        await asyncio.to_thread(worker.process.wait, 60)
    code = worker.stop()
    log = worker.log_text()
    assert code not in (0, None), log
    assert "refused the SASL login" in log and "bad-password-456" not in log
