"""A real streaming worker in a subprocess, for end-to-end tests.

The worker is started exactly as an operator would run it: a ``config.toml``
on disk, ``KAFKA_BOOTSTRAP_SERVERS`` and ``POSTGRES_DSN`` in the environment,
``streams.cli.worker.run_worker(load_settings(path))`` as the entry point (not the
command line, so these tests do not depend on how ``compactor worker`` is
wired). Its stdout/stderr go to a log file whose tail a failing test prints.

Every worker dies with the test process (``PR_SET_PDEATHSIG`` on Linux), so a
crashed or interrupted session leaves no worker behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp

REPO_ROOT = Path(__file__).resolve().parents[2]

# The worker's entry point: what ``compactor worker`` does, minus argument
# parsing. SIGUSR2 makes it print the stack of every asyncio task and thread
# to its log (see ``WorkerProcess.dump_stacks``), for diagnosing a hang.
WORKER_SCRIPT = """\
import asyncio, faulthandler, signal, sys

def _dump_tasks(signum, frame):
    loop = asyncio._get_running_loop()
    print("=== asyncio tasks (SIGUSR2) ===", file=sys.stderr, flush=True)
    for task in asyncio.all_tasks(loop) if loop is not None else ():
        task.print_stack(limit=12, file=sys.stderr)
    faulthandler.dump_traceback(all_threads=True)
    sys.stderr.flush()

signal.signal(signal.SIGUSR2, _dump_tasks)

from core.settings import load_settings
from streams.cli.worker import run_worker
sys.exit(run_worker(load_settings(sys.argv[1])))
"""

# Environment a worker must not inherit: provider keys would switch the
# summariser, a config path or dev stack would change where it connects.
_SCRUBBED_ENV = (
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "COMPACTOR_CONFIG",
    "POSTGRES_DSN",
    "KAFKA_BOOTSTRAP_SERVERS",
)


class WorkerError(AssertionError):
    """The worker died or never became ready; the message carries its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def render_toml(sections: Mapping[str, Mapping[str, Any]]) -> str:
    lines: list[str] = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
        lines.append("")
    return "\n".join(lines)


def merge_sections(
    base: Mapping[str, Mapping[str, Any]], overrides: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    merged = {section: dict(values) for section, values in base.items()}
    for section, values in overrides.items():
        merged.setdefault(section, {}).update(values)
    return merged


def _die_with_parent() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG

    return preexec


class WorkerProcess:
    """One worker subprocess with its own config file, data dir, web port and log."""

    def __init__(
        self,
        root: Path,
        name: str,
        *,
        bootstrap: str,
        dsn: str,
        config: Mapping[str, Mapping[str, Any]],
        env: Mapping[str, str] | None = None,
        extra_toml: str = "",
        code_root: Path = REPO_ROOT,
    ) -> None:
        self.name = name
        # Whose code runs: this checkout, or another release's tree (a git worktree
        # of its commit, tests/chaos/test_upgrade.py) with this .venv's packages.
        self.code_root = code_root
        self.extra_toml = extra_toml  # appended to config.toml (e.g. [[service.tokens]])
        self.root = root / name
        self.root.mkdir(parents=True, exist_ok=True)
        self.web_port = free_port()
        self.bootstrap = bootstrap
        self.dsn = dsn
        self.config = merge_sections(
            config,
            {
                "service": {
                    "web_host": "127.0.0.1",
                    "web_port": self.web_port,
                    "data_dir": str(self.root / "state"),
                }
            },
        )
        self.extra_env = dict(env or {})
        # Bearer tokens the harness sends: ``token`` to the data views,
        # ``operations_token`` to /healthz and /metrics ([service].metrics_token).
        self.token: str | None = None
        self.operations_token: str | None = None
        self.config_path = self.root / "config.toml"
        self.log_path = self.root / "worker.log"
        self.process: subprocess.Popen[bytes] | None = None

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> WorkerProcess:
        if self.process is not None:
            raise RuntimeError(f"worker {self.name} already started")
        self.config_path.write_text(render_toml(self.config) + self.extra_toml, encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        env.update(
            {
                "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
                "POSTGRES_DSN": self.dsn,
                "PYTHONUNBUFFERED": "1",
                # The file a token reload (SIGHUP) reads again, as `compactor worker` passes it.
                "COMPACTOR_CONFIG": str(self.config_path),
                # The code root first, ahead of the editable install of this checkout.
                "PYTHONPATH": os.pathsep.join(
                    [str(self.code_root), *filter(None, [os.environ.get("PYTHONPATH")])]
                ),
                **self.extra_env,
            }
        )
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", WORKER_SCRIPT, str(self.config_path)],
                cwd=self.code_root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent(),
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (a graceful Faust shutdown), then SIGKILL after ``timeout``."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode

    async def stop_async(self, timeout: float = 30.0) -> int | None:
        return await asyncio.to_thread(self.stop, timeout)

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no offset commit, nothing flushed."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def dump_stacks(self) -> None:
        """Have a running worker write its task and thread stacks to its log."""
        if self.alive and self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGUSR2)

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def _fail(self, what: str) -> WorkerError:
        state = "running" if self.alive else f"exited with {self.process and self.process.poll()}"
        return WorkerError(
            f"worker {self.name} ({state}): {what}\n--- {self.log_path} ---\n{self.log_tail()}"
        )

    # -- HTTP ---------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    async def get(
        self,
        path: str,
        params: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        *,
        token: str | None = None,
    ) -> tuple[int, Any]:
        """GET a view; (status, parsed JSON or text). ``token`` overrides the worker's."""
        if token is None:
            operations = path in ("/healthz", "/metrics")
            token = self.operations_token if operations else self.token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.get(self.url + path, params=params, headers=headers) as response,
        ):
            if response.content_type == "application/json":
                return response.status, await response.json()
            return response.status, await response.text()

    async def get_json(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        status, body = await self.get(path, params)
        if status != 200:
            raise AssertionError(f"GET {path} on {self.name}: {status} {body!r}")
        return body

    async def metrics_text(self) -> str:
        status, body = await self.get("/metrics")
        if status != 200 or not isinstance(body, str):
            raise AssertionError(f"GET /metrics on {self.name}: {status}")
        return body

    async def health(self) -> dict[str, Any] | None:
        """The /healthz body, or None while the web server is not up yet."""
        try:
            status, body = await self.get("/healthz", timeout=3.0)
        except (aiohttp.ClientError, TimeoutError):
            return None
        # 503 is a worker that answers but reports a problem (a database outage…).
        return body if status in (200, 503) and isinstance(body, dict) else None

    async def assigned(self, topic: str) -> set[int] | None:
        health = await self.health()
        if health is None:
            return None
        found = set()
        for entry in health.get("assigned_partitions", []):
            name, _, partition = str(entry).rpartition(":")
            if name == topic:
                found.add(int(partition))
        return found

    async def wait_ready(self, topic: str, timeout: float = 60.0) -> set[int]:
        """Until /healthz answers with partitions of ``topic`` assigned; returns them."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive:
                raise self._fail("exited before becoming ready")
            partitions = await self.assigned(topic)
            if partitions:
                return partitions
            if time.monotonic() > deadline:
                raise self._fail(f"no partition of {topic} assigned within {timeout:.0f}s")
            await asyncio.sleep(0.25)


async def wait_for_split(
    workers: list[WorkerProcess], topic: str, partitions: int, timeout: float = 60.0
) -> list[set[int]]:
    """Until every worker owns some of ``topic``'s partitions, disjointly, covering all."""
    deadline = time.monotonic() + timeout
    last: list[set[int] | None] = []
    while True:
        for worker in workers:
            if not worker.alive:
                raise worker._fail("exited while waiting for the partition split")
        last = [await worker.assigned(topic) for worker in workers]
        owned = [p for p in last if p]
        if len(owned) == len(workers):
            union: set[int] = set().union(*owned)
            disjoint = sum(len(p) for p in owned) == len(union)
            if disjoint and union == set(range(partitions)):
                return owned
        if time.monotonic() > deadline:
            tails = "\n".join(w._fail("split").args[0] for w in workers)
            raise AssertionError(
                f"partitions of {topic} never split across the workers: {last}\n{tails}"
            )
        await asyncio.sleep(0.25)


def terminate_all(workers: list[WorkerProcess]) -> None:
    """Teardown: whatever is still running is stopped, gracefully first."""
    for worker in workers:
        if worker.alive and worker.process is not None:
            with contextlib.suppress(ProcessLookupError):
                worker.process.send_signal(signal.SIGTERM)
    for worker in workers:
        worker.stop(timeout=20.0)
