"""Where every command finds Kafka and PostgreSQL: env > config file > running dev stack.

Why: ``compactor dev up`` is only useful if the other commands find its
services by themselves, and a stale ``stack.json`` (stack stopped by a
reboot, pid reused) must never send them to a dead address.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.settings import Settings, parse_settings
from devtools import dev_compose, dev_processes, dev_services, devstack
from devtools.localstack import free_port
from streams import stack_state
from streams.addresses import configured_bootstrap
from streams.database import configured_dsn
from streams.stack_state import StackState, write_state

pytestmark = pytest.mark.unit

DEV_KAFKA = "127.0.0.1:39092"
DEV_DSN = "postgresql://postgres:@/postgres?host=/tmp/dev-stack/postgres"


@pytest.fixture
def fake_service() -> Iterator[int]:
    """A live process whose command line names both modules ``dev up`` runs."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
            stack_state.KAFKA_LAUNCHER_MODULE,
            stack_state.POSTGRES_LAUNCHER_MODULE,
        ]
    )
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def stack_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("POSTGRES_DSN", raising=False)
    monkeypatch.setenv(stack_state.DEV_STATE_DIR_ENV, str(tmp_path / "dev"))
    return tmp_path / "dev"


def record(stack_dir: Path, pids: dict[str, int], launcher: str = "processes") -> None:
    write_state(
        stack_dir,
        StackState(kafka_bootstrap=DEV_KAFKA, postgres_dsn=DEV_DSN, pids=pids, launcher=launcher),
    )


def test_nothing_configured_and_no_stack_means_none(stack_dir: Path) -> None:
    assert configured_bootstrap(Settings()) is None
    assert configured_dsn(Settings()) is None


def test_a_running_dev_stack_is_found(stack_dir: Path, fake_service: int) -> None:
    record(stack_dir, {"kafka": fake_service, "postgres": fake_service})
    assert configured_bootstrap(Settings()) == DEV_KAFKA
    assert configured_dsn(Settings()) == DEV_DSN
    assert configured_bootstrap(Settings(), dev_stack=False) is None
    assert configured_dsn(Settings(), dev_stack=False) is None


def test_config_file_beats_the_dev_stack_and_env_beats_both(
    stack_dir: Path, fake_service: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(stack_dir, {"kafka": fake_service, "postgres": fake_service})
    settings = parse_settings(
        {
            "kafka": {"bootstrap_servers": "file:9092"},
            "postgres": {"dsn": "postgresql://file/db"},
        }
    )
    assert configured_bootstrap(settings) == "file:9092"
    assert configured_dsn(settings) == "postgresql://file/db"
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "env:9092")
    monkeypatch.setenv("POSTGRES_DSN", "postgresql://env/db")
    assert configured_bootstrap(settings) == "env:9092"
    assert configured_dsn(settings) == "postgresql://env/db"


def test_a_dead_service_is_not_used(stack_dir: Path, fake_service: int) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    record(stack_dir, {"kafka": gone.pid, "postgres": fake_service})
    assert configured_bootstrap(Settings()) is None
    assert configured_dsn(Settings()) == DEV_DSN


def test_a_reused_pid_is_not_ours(stack_dir: Path) -> None:
    # This test process is alive, but it is not what `dev up` started.
    record(stack_dir, {"kafka": os.getpid(), "postgres": os.getpid()})
    assert not stack_state.owns_pid("kafka", os.getpid())
    assert configured_bootstrap(Settings()) is None
    assert configured_dsn(Settings()) is None


def test_a_docker_compose_stack_is_trusted_without_pids(stack_dir: Path) -> None:
    record(stack_dir, {}, launcher=stack_state.DOCKER_COMPOSE)
    assert configured_bootstrap(Settings()) == DEV_KAFKA
    assert configured_dsn(Settings()) == DEV_DSN


def test_an_unreadable_state_file_is_ignored(stack_dir: Path) -> None:
    stack_dir.mkdir(parents=True)
    (stack_dir / "stack.json").write_text("{half a file")
    assert configured_bootstrap(Settings()) is None


def test_default_state_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(stack_state.DEV_STATE_DIR_ENV, raising=False)
    assert stack_state.default_state_dir() == Path(".state/dev")


def test_redact_dsn_hides_only_the_password() -> None:
    assert (
        devstack.redact_dsn("postgresql://app:s3cret@db.example:5432/main?sslmode=require")
        == "postgresql://app:***@db.example:5432/main?sslmode=require"
    )
    assert devstack.redact_dsn(DEV_DSN) == DEV_DSN


def test_export_lines_name_the_state_dir_only_when_not_the_default() -> None:
    reports = [
        devstack.ServiceReport("kafka", "started", "dev up", DEV_KAFKA, 1, True, True),
        devstack.ServiceReport(
            "postgres", "configured", "$POSTGRES_DSN", DEV_DSN, None, None, True
        ),
    ]
    assert devstack.export_lines(reports, stack_state.DEFAULT_STATE_DIR) == [
        f"export KAFKA_BOOTSTRAP_SERVERS='{DEV_KAFKA}'"
    ]
    custom = devstack.export_lines(reports, Path("/srv/stack"))
    assert custom[-1] == f"export {stack_state.DEV_STATE_DIR_ENV}='/srv/stack'"


async def test_without_java_and_without_docker_up_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devstack, "_java_tools_problem", lambda: "`java` not found on PATH")
    monkeypatch.setattr(devstack, "docker_engine_available", lambda: False)
    explicit = stack_state.Explicit(None, "-", None, "-")
    with pytest.raises(devstack.DevStackError) as caught:
        await devstack.up(tmp_path / "dev", explicit, say=lambda _: None)
    message = str(caught.value)
    assert "apt-get install -y openjdk-17-jre-headless maven" in message
    assert "`java` not found" in message
    assert not (tmp_path / "dev" / "stack.json").exists()


async def test_without_java_but_with_docker_up_and_down_use_compose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, ...]] = []

    def compose(*args: str) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        return subprocess.CompletedProcess(["docker", "compose", *args], 0, "", "")

    async def answers(address: str, probe_seconds: float = 1.0) -> bool:
        return True

    async def migrated(dsn: str) -> list[str]:
        return []

    monkeypatch.setattr(devstack, "_java_tools_problem", lambda: "`java` not found on PATH")
    monkeypatch.setattr(devstack, "docker_engine_available", lambda: True)
    monkeypatch.setattr(dev_compose, "_compose", compose)
    monkeypatch.setattr(dev_services, "kafka_answers", answers)
    monkeypatch.setattr(dev_services, "postgres_answers", answers)
    monkeypatch.setattr(devstack, "migrate", migrated)
    state_dir = tmp_path / "dev"
    explicit = stack_state.Explicit(None, "-", None, "-")

    reports = await devstack.up(state_dir, explicit, say=lambda _: None)

    assert calls == [("up", "-d", "kafka", "postgres")]
    assert [(r.name, r.source, r.address) for r in reports] == [
        ("kafka", "docker compose", devstack.COMPOSE_BOOTSTRAP),
        ("postgres", "docker compose", devstack.COMPOSE_DSN),
    ]
    state = stack_state.running_stack(state_dir)
    assert state is not None and state.launcher == stack_state.DOCKER_COMPOSE
    again = await devstack.up(state_dir, explicit, say=lambda _: None)
    assert {r.source for r in again} == {"already running"}
    assert len(calls) == 1

    assert await devstack.down(state_dir, say=lambda _: None)
    assert calls[-1] == ("down",)
    assert stack_state.running_stack(state_dir) is None


# --------------------------------------------------------------------------- restarts


@dataclass
class FakeLaunch:
    """``dev up`` with its launchers replaced: records each argv, answers at once."""

    argvs: list[list[str]]
    said: list[str]

    def of(self, module: str) -> list[list[str]]:
        return [argv for argv in self.argvs if module in argv]


@pytest.fixture
def fake_launch(monkeypatch: pytest.MonkeyPatch, fake_service: int) -> FakeLaunch:
    launch = FakeLaunch([], [])

    class Proc:
        pid = fake_service

        def poll(self) -> int | None:
            return None

    def spawn(argv: list[str], log_path: Path) -> Proc:
        launch.argvs.append(argv)
        if stack_state.KAFKA_LAUNCHER_MODULE in argv:
            port = argv[argv.index("--port") + 1] if "--port" in argv else "45678"
            ready = Path(argv[argv.index("--ready-file") + 1])
            ready.write_text(f"KAFKA_BOOTSTRAP=127.0.0.1:{port}\n")
        else:
            with log_path.open("a") as log:
                log.write(f"POSTGRES_DSN={DEV_DSN}\n")
        return Proc()

    async def answers(address: str, probe_seconds: float = 1.0) -> bool:
        return True

    async def migrated(dsn: str) -> list[str]:
        return []

    monkeypatch.setattr(devstack, "_java_tools_problem", lambda: None)
    monkeypatch.setattr(dev_processes, "_spawn", spawn)
    monkeypatch.setattr(dev_services, "kafka_answers", answers)
    monkeypatch.setattr(dev_services, "postgres_answers", answers)
    monkeypatch.setattr(devstack, "migrate", migrated)
    return launch


def dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def record_dead_stack(state_dir: Path, port: int, controller_port: int) -> StackState:
    """A stack ``dev up`` started before, whose launchers have both died since."""
    kafka_dir = state_dir / "kafka"
    kafka_dir.mkdir(parents=True)
    (kafka_dir / "server.properties").write_text(
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}\n"
    )
    state = StackState(
        kafka_bootstrap=f"127.0.0.1:{port}",
        postgres_dsn=DEV_DSN,
        pids={"kafka": dead_pid(), "postgres": dead_pid()},
        data_dirs={"kafka": str(kafka_dir.resolve()), "postgres": str(state_dir / "postgres")},
    )
    write_state(state_dir, state)
    return state


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.fixture
def listening() -> Iterator[Callable[[], int]]:
    """Opens loopback sockets that listen, as another process's server would."""
    sockets: list[socket.socket] = []

    def open_one() -> int:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        sockets.append(sock)
        return int(sock.getsockname()[1])

    yield open_one
    for sock in sockets:
        sock.close()


async def test_a_dead_broker_comes_back_on_its_recorded_ports_and_data_dir(
    tmp_path: Path, fake_launch: FakeLaunch
) -> None:
    state_dir = tmp_path / "dev"
    port, controller = free_port(), free_port()
    record_dead_stack(state_dir, port, controller)
    explicit = stack_state.Explicit(None, "-", None, "-")

    reports = await devstack.up(state_dir, explicit, say=fake_launch.said.append)

    [kafka] = fake_launch.of(stack_state.KAFKA_LAUNCHER_MODULE)
    assert option(kafka, "--port") == str(port)
    assert option(kafka, "--controller-port") == str(controller)
    assert option(kafka, "--data-dir") == str((state_dir / "kafka").resolve())
    [postgres] = fake_launch.of(stack_state.POSTGRES_LAUNCHER_MODULE)
    assert option(postgres, "--data-dir") == str((state_dir / "postgres").resolve())
    assert [(r.name, r.source, r.address) for r in reports] == [
        ("kafka", "started", f"127.0.0.1:{port}"),
        ("postgres", "started", DEV_DSN),
    ]
    state = stack_state.read_state(state_dir)
    assert state is not None and state.kafka_bootstrap == f"127.0.0.1:{port}"
    assert state.postgres_dsn == DEV_DSN
    assert not [line for line in fake_launch.said if "moved" in line]


async def test_a_fresh_stack_lets_the_broker_pick_free_ports(
    tmp_path: Path, fake_launch: FakeLaunch
) -> None:
    explicit = stack_state.Explicit(None, "-", None, "-")
    await devstack.up(tmp_path / "dev", explicit, say=fake_launch.said.append)
    [kafka] = fake_launch.of(stack_state.KAFKA_LAUNCHER_MODULE)
    assert "--port" not in kafka and "--controller-port" not in kafka


async def test_a_recorded_broker_port_taken_by_another_process_is_an_error_naming_it(
    tmp_path: Path, fake_launch: FakeLaunch, listening: Callable[[], int]
) -> None:
    state_dir = tmp_path / "dev"
    port = listening()
    before = record_dead_stack(state_dir, port, free_port())
    explicit = stack_state.Explicit(None, "-", None, "-")

    with pytest.raises(devstack.DevStackError) as caught:
        await devstack.up(state_dir, explicit, say=fake_launch.said.append)

    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message and f"port {port} is now taken by" in message
    assert f"pid {os.getpid()}" in message  # this test process listens there
    assert "`compactor dev down` and `compactor dev up`" in message
    assert fake_launch.argvs == []  # nothing started, nothing moved
    assert stack_state.read_state(state_dir) == before


async def test_a_taken_controller_port_moves_but_the_client_port_stays(
    tmp_path: Path, fake_launch: FakeLaunch, listening: Callable[[], int]
) -> None:
    state_dir = tmp_path / "dev"
    port, controller = free_port(), listening()
    record_dead_stack(state_dir, port, controller)
    explicit = stack_state.Explicit(None, "-", None, "-")

    reports = await devstack.up(state_dir, explicit, say=fake_launch.said.append)

    [kafka] = fake_launch.of(stack_state.KAFKA_LAUNCHER_MODULE)
    assert option(kafka, "--port") == str(port)
    assert "--controller-port" not in kafka
    assert any(f"controller port {controller}" in line for line in fake_launch.said)
    assert reports[0].address == f"127.0.0.1:{port}"
