"""The README's "Running it yourself" walk-through, run as written.

Why: it is the first thing a newcomer runs. When its worker ran on the
default budget (160,000 tokens) the ~2,000-token sample was never compacted
and ``compactor tail --from-beginning`` waited forever, with every other test
green. This test reads the commands out of README.md and runs them in order
through the CLI entry point, in a directory laid out like a fresh clone
(``samples/``), against the session's Kafka and PostgreSQL. The only
changes: its own topic prefix, app id and HTTP port (written into every
config the commands read), ``tail`` bounded with ``--max 1 --timeout``, and
the worker started in the background, as the README's "second terminal".
``dev up``/``dev down`` find the configured Kafka and PostgreSQL and start
nothing. A step it does not know fails the test: update it with the README.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from streams.stack_state import DEV_STATE_DIR_ENV
from tests.support.walkthrough import ROOT, Step, walkthrough_steps
from tests.support.worker import free_port, merge_sections, render_toml

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(420)]

SAMPLE_CONVERSATION = "support-payments-0042"
DEFAULT_WEB_PORT = 6066
TAIL_IDLE_SECONDS = 120  # generous: the sample is compacted within seconds
CLIP_LINE = re.compile(
    rf"{SAMPLE_CONVERSATION} compaction \S+ \(gen 0\): \d+ messages compressed, tokens \d+ → \d+"
)


def newcomer_env(kafka_bootstrap: str, postgres_dsn: str, dev_state: Path) -> dict[str, str]:
    """No API keys or tokens, no compactor settings: only where Kafka and PostgreSQL are."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("COMPACTOR_")
        and k
        not in {"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "KAFKA_BOOTSTRAP_SERVERS", "POSTGRES_DSN"}
    }
    env.update(
        KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap,
        POSTGRES_DSN=postgres_dsn,
        **{DEV_STATE_DIR_ENV: str(dev_state)},
    )
    return env


def lay_out_checkout(workdir: Path, overrides: dict[str, dict[str, Any]]) -> None:
    """``samples/`` as in the repository, every config in it (and ./config.toml) with
    ``overrides`` merged in, so the commands run unchanged but touch nothing shared."""
    samples = workdir / "samples"
    samples.mkdir()
    for source in sorted((ROOT / "samples").iterdir()):
        if source.suffix == ".toml":
            merged = merge_sections(tomllib.loads(source.read_text()), overrides)
            (samples / source.name).write_text(render_toml(merged))
        elif source.is_file():
            shutil.copyfile(source, samples / source.name)
    (workdir / "config.toml").write_text(render_toml(overrides))


def cli_argv(step: Step) -> list[str]:
    return [sys.executable, "-m", "streams.cli", *step.argv[1:]]


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, None


class Worker:
    """The README's "second terminal"."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, port: int) -> None:
        self.log = cwd / "worker.log"
        self.port = port
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT
            )

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    async def wait_ready(self, seconds: float = 90) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the worker exited:\n{self.log_tail()}"
            try:
                status, _ = await asyncio.to_thread(get, f"http://127.0.0.1:{self.port}/healthz")
                if status == 200:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            await asyncio.sleep(0.5)
        raise AssertionError(f"the worker did not answer in {seconds:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Ctrl-C, as the README says."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


async def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        argv,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TAIL_IDLE_SECONDS + 60,
        check=False,
    )


async def test_the_readme_walkthrough_compacts_the_sample_conversation(
    tmp_path: Path, kafka_bootstrap: str, pg_database: str
) -> None:
    steps = walkthrough_steps()
    port = free_port()
    unique = uuid.uuid4().hex[:10]
    lay_out_checkout(
        tmp_path,
        {
            "kafka": {"topic_prefix": f"walk{unique}."},
            "service": {"app_id": f"walkthrough-{unique}", "web_port": port},
        },
    )
    env = newcomer_env(kafka_bootstrap, pg_database, tmp_path / "dev-state")
    worker: Worker | None = None
    tailed = curled = False
    try:
        for step in steps:
            command = step.compactor_command()
            context = f"README step `{step.line}`"
            if step.argv == ("./scripts/setup",):
                continue  # the test runs in the set-up .venv
            if command == "worker":
                worker = Worker(cli_argv(step), env, tmp_path, port)
                await worker.wait_ready()
            elif command == "tail":
                argv = cli_argv(step)
                if "--max" not in argv:
                    argv += ["--max", "1", "--timeout", str(TAIL_IDLE_SECONDS)]
                done = await run(argv, env, tmp_path)
                log = worker.log_tail() if worker else "(no worker started)"
                assert done.returncode == 0, (
                    f"{context}: no clip-archive event within {TAIL_IDLE_SECONDS}s "
                    f"(exit {done.returncode}):\n{done.stdout}{done.stderr}\nworker log:\n{log}"
                )
                assert CLIP_LINE.search(done.stdout), f"{context} printed:\n{done.stdout}"
                tailed = True
            elif command is not None:
                if command == "dev" and step.argv[-1] == "down" and worker is not None:
                    worker.stop()  # "after stopping the worker (Ctrl-C)"
                done = await run(cli_argv(step), env, tmp_path)
                assert done.returncode == 0, f"{context}: exit {done.returncode}\n{done.stderr}"
            elif step.argv[0] == "curl":
                url = urllib.parse.urlsplit("http://" + step.argv[-1].removeprefix("http://"))
                assert url.port == DEFAULT_WEB_PORT, f"{context}: not the worker's default port"
                status, body = await asyncio.to_thread(
                    get, url._replace(netloc=f"127.0.0.1:{port}").geturl()
                )
                assert status == 200, f"{context}: HTTP {status}"
                if url.path.endswith("/history"):
                    assert body["conversation_id"] == SAMPLE_CONVERSATION
                    assert body["clip_archive"] is not None, f"{context}: no clip-archive"
                    assert body["clip_archive"]["role"] == "system"
                curled = True
            else:
                pytest.fail(f"{context}: this test does not know how to run it; teach it")
    finally:
        if worker is not None:
            worker.stop()
    assert worker is not None and tailed and curled, "the walk-through lost a step"
