"""``dev up`` without Java and Maven: both services from ``docker-compose.yml``.

Used only when a Docker engine answers; ``stack.json`` then records the
compose file, so ``dev down`` stops the containers rather than processes.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from pathlib import Path

from devtools.dev_services import DevStackError, Say, answers
from streams.stack_state import DOCKER_COMPOSE, KAFKA, POSTGRES, StackState

#: The checkout this module runs from (``docker-compose.yml`` lives there);
#: meaningless in an installed wheel, which has no checkout.
REPO_ROOT = Path(__file__).resolve().parent.parent

COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
#: Where ``docker-compose.yml`` publishes the services on the host.
COMPOSE_BOOTSTRAP = "127.0.0.1:9092"
COMPOSE_DSN = "postgresql://compactor:compactor@127.0.0.1:5432/compactor"
COMPOSE_READY_TIMEOUT = 240.0


def docker_engine_available() -> bool:
    """``docker info`` succeeds: a client alone (no engine) cannot run anything."""
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        proc = subprocess.run(
            [docker, "info"], capture_output=True, timeout=20, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


#: Compose interpolates the whole file, the worker's required API token included,
#: even when only Kafka and PostgreSQL are started; ``dev`` never starts the worker.
INFRA_ONLY_ENV = {"COMPACTOR_API_TOKENS": "unused-dev-stack-starts-no-worker"}


def _compose(*args: str) -> subprocess.CompletedProcess[str]:
    docker = shutil.which("docker") or "docker"
    cmd = [docker, "compose", "-f", str(COMPOSE_FILE), *args]
    env = {**INFRA_ONLY_ENV, **os.environ}
    try:
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise DevStackError(f"`{' '.join(cmd)}` failed: {error}") from error


async def compose_up(services: list[str], say: Say, why: str) -> None:
    if not COMPOSE_FILE.exists():
        raise DevStackError(f"{why}, and there is no {COMPOSE_FILE} to run with docker compose")
    say(f"{why}: starting {', '.join(services)} with docker compose ({COMPOSE_FILE})")
    proc = await asyncio.to_thread(_compose, "up", "-d", *services)
    if proc.returncode != 0:
        raise DevStackError(
            f"`docker compose up -d {' '.join(services)}` failed (exit {proc.returncode}):\n"
            + (proc.stderr or proc.stdout)[-3000:]
        )
    deadline = time.monotonic() + COMPOSE_READY_TIMEOUT
    while time.monotonic() < deadline:
        kafka_ok = KAFKA not in services or await answers(KAFKA, COMPOSE_BOOTSTRAP)
        pg_ok = POSTGRES not in services or await answers(POSTGRES, COMPOSE_DSN)
        if kafka_ok and pg_ok:
            return
        await asyncio.sleep(1.0)
    raise DevStackError(
        f"docker compose started {', '.join(services)} but they did not answer within "
        f"{COMPOSE_READY_TIMEOUT:.0f}s; see `docker compose -f {COMPOSE_FILE} logs`"
    )


def record_compose(state: StackState, services: list[str]) -> None:
    state.launcher = DOCKER_COMPOSE
    state.pids = {}
    state.data_dirs["compose_file"] = str(COMPOSE_FILE)
    if KAFKA in services:
        state.kafka_bootstrap = COMPOSE_BOOTSTRAP
    if POSTGRES in services:
        state.postgres_dsn = COMPOSE_DSN


async def compose_down(state: StackState, say: Say) -> None:
    """``docker compose down`` on the compose file the stack was started from."""
    compose_file = state.data_dirs.get("compose_file", str(COMPOSE_FILE))
    say(f"docker compose -f {compose_file} down")
    proc = await asyncio.to_thread(_compose, "down")
    if proc.returncode != 0:
        raise DevStackError(
            f"`docker compose down` failed (exit {proc.returncode}):\n"
            + (proc.stderr or proc.stdout)[-3000:]
        )
