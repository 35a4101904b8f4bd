"""One local broker (KRaft, broker and controller in one JVM) on loopback, without Docker.

The broker runs as a plain ``java`` child process with its data under a
directory the caller owns, so several brokers (parallel test sessions,
``dev up``) never share ports or files. ``start_kafka`` starts one and waits
until clients can use it; ``devtools.kafka_cluster`` builds clusters of them.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import struct
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from devtools import kafka_config
from devtools.kafka_errors import BrokerStartError, LocalStackError
from devtools.kafka_jars import KAFKA_LOG4J_CONFIG, ensure_kafka_jars, find_java
from devtools.kafka_secure import SecureBroker
from devtools.processes import free_port, parent_death_preexec, runs_broker, tail_text
from streams.kafka.probe import LOOPBACK, probe_brokers
from streams.kafka.security import PLAINTEXT, KafkaSecurity

NODE_ID = 1

DEFAULT_HEAP_OPTS: tuple[str, ...] = ("-Xmx512m", "-Xms256m")
#: Serial GC rather than Kafka's G1: no concurrent GC threads competing with the
#: tests for the machine's 2 cores, and a 512 MiB heap keeps its pauses short.
#: Start-up time and RSS measured the same with either.
DEFAULT_JVM_OPTS: tuple[str, ...] = (
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)


def new_cluster_id() -> str:
    """A Kafka cluster id (base64url of a UUID), made here to spare a JVM start."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class KafkaBroker:
    """One broker+controller JVM whose files all live under ``data_dir``.

    ``data_dir`` holds ``server.properties``, ``broker.log`` (the JVM's
    stdout/stderr), ``broker.pid`` and ``kafka-logs/``. Reusing a data dir
    keeps topics and offsets; two live brokers can never share one.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        controller_port: int | None = None,
        *,
        num_partitions: int = 4,
        jars_dir: Path | None = None,
        extra_config: Mapping[str, str | int] | None = None,
        heap_opts: Sequence[str] = DEFAULT_HEAP_OPTS,
        jvm_opts: Sequence[str] = DEFAULT_JVM_OPTS,
        die_with_parent: bool = True,
        secure: SecureBroker | None = None,
        node_id: int = NODE_ID,
        quorum: Sequence[tuple[int, int]] | None = None,
        cluster_id: str | None = None,
        replication: int = 1,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.node_id = node_id
        self.port = port if port is not None else free_port()
        self.controller_port = controller_port if controller_port is not None else free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        self.secure = secure
        #: The SSL (client certificate) listener of a secure broker.
        self.ssl_port = free_port() if secure is not None else None
        while self.ssl_port in (self.port, self.controller_port):
            self.ssl_port = free_port()
        self.num_partitions = num_partitions
        self.jars_dir = jars_dir
        self.extra_config = dict(extra_config or {})
        self.heap_opts = tuple(heap_opts)
        self.jvm_opts = tuple(jvm_opts) + tuple(os.environ.get("KAFKA_JVM_OPTS", "").split())
        self.die_with_parent = die_with_parent
        #: (node id, controller port) of every controller; alone, this node only.
        self.quorum = tuple(quorum) if quorum else ((node_id, self.controller_port),)
        self.cluster_id = cluster_id
        self.replication = replication
        self._proc: subprocess.Popen[bytes] | None = None

    # ----------------------------------------------------------- properties

    @property
    def bootstrap_servers(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def log_dirs(self) -> Path:
        return self.data_dir / "kafka-logs"

    @property
    def properties_path(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "broker.log"

    @property
    def pid_path(self) -> Path:
        return self.data_dir / "broker.pid"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def probe_security(self) -> KafkaSecurity:
        """How the launcher itself talks to the broker (``admin`` on a secure one)."""
        return self.secure.admin_security() if self.secure is not None else PLAINTEXT

    @property
    def ssl_bootstrap_servers(self) -> str | None:
        return f"{LOOPBACK}:{self.ssl_port}" if self.ssl_port is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def server_properties(self) -> dict[str, str]:
        """The broker's configuration (``devtools.kafka_config``)."""
        return kafka_config.server_properties(self)

    # ----------------------------------------------------------- lifecycle

    def _java_cmd(self, main_class: str, *args: str, heap: Sequence[str]) -> list[str]:
        jars = self.jars_dir if self.jars_dir is not None else ensure_kafka_jars()
        return [
            find_java(),
            *heap,
            *self.jvm_opts,
            f"-Dlog4j2.configurationFile={KAFKA_LOG4J_CONFIG}",
            "-cp",
            f"{jars}/*",
            main_class,
            *args,
        ]

    def _check_not_running_elsewhere(self) -> None:
        try:
            other = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return
        if other != os.getpid() and runs_broker(other, self.properties_path):
            raise LocalStackError(
                f"a broker (pid {other}) already runs in {self.data_dir}; "
                "stop it or give this one another data dir"
            )

    def _format_storage(self) -> None:
        """Write the KRaft metadata a broker refuses to start without (skipped when present)."""
        if (self.log_dirs / "meta.properties").exists():
            return
        cmd = self._java_cmd(
            "kafka.tools.StorageTool",
            "format",
            # One argument, "=" form: a base64 id may start with "-", which the
            # tool's parser would take for an option (1 start in 64 failed).
            f"--cluster-id={self.cluster_id or new_cluster_id()}",
            "--config",
            str(self.properties_path),
            "--ignore-formatted",
            *(self.secure.format_args() if self.secure is not None else ()),
            heap=("-Xmx256m", "-XX:TieredStopAtLevel=1"),
        )
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise BrokerStartError(
                f"formatting {self.log_dirs} failed (exit {proc.returncode}):\n"
                + tail_text(proc.stdout + proc.stderr, 30)
            )

    def prepare(self) -> Self:
        """Write the config and format storage if new (a JVM of its own, ~2 s)."""
        if self.jars_dir is None:
            self.jars_dir = ensure_kafka_jars()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._check_not_running_elsewhere()
        self.properties_path.write_text(
            "".join(f"{key}={value}\n" for key, value in self.server_properties().items())
        )
        self._format_storage()
        return self

    def start(self) -> Self:
        """Write the config, format storage if new, and launch the JVM (not yet ready).

        Call it from a thread that outlives the broker: the kernel's parent-death
        signal (``die_with_parent``) fires when the launching *thread* exits."""
        if self.is_running():
            return self
        self.prepare()
        cmd = self._java_cmd("kafka.Kafka", str(self.properties_path), heap=self.heap_opts)
        with self.log_path.open("ab") as log:
            log.write(f"\n=== starting broker: {' '.join(cmd)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,  # own process group: signals from a TTY skip it
                preexec_fn=parent_death_preexec() if self.die_with_parent else None,
            )
        self.pid_path.write_text(f"{self._proc.pid}\n")
        return self

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no broker log)"
        return tail_text(text, lines)

    def wait_ready(self, timeout: float = 60.0) -> Self:
        """Block until a metadata request lists this broker; raise with its log otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            if self._proc is None:
                raise BrokerStartError("broker was never started")
            code = self._proc.poll()
            if code is not None:
                raise BrokerStartError(
                    f"Kafka broker exited with code {code} before becoming ready; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                if any(
                    node == self.node_id
                    for node, _, _ in probe_brokers(LOOPBACK, self.port, 1.0, self.probe_security)
                ):
                    return self
            except (OSError, struct.error, ValueError):
                pass
            if time.monotonic() >= deadline:
                raise BrokerStartError(
                    f"Kafka broker not ready on {self.bootstrap_servers} after {timeout:.0f}s; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM for a clean shutdown (flushes logs, closes the quorum), SIGKILL if it hangs.

        In a cluster SIGTERM is a controlled shutdown: the controller moves the
        node's partition leaderships to the other replicas before it goes."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self._forget(proc.pid)

    def kill(self) -> None:
        """SIGKILL, as a machine that loses power: no controlled shutdown, no flush."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        self._forget(proc.pid)

    def _forget(self, pid: int) -> None:
        with contextlib.suppress(OSError, ValueError):
            if int(self.pid_path.read_text().strip()) == pid:
                self.pid_path.unlink()

    def __enter__(self) -> Self:
        if not self.is_running():
            self.start().wait_ready()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (
            f"KafkaBroker(node {self.node_id}, {self.bootstrap_servers}, "
            f"data_dir={self.data_dir}, pid={self.pid})"
        )


def start_kafka(
    data_dir: Path,
    port: int | None = None,
    controller_port: int | None = None,
    *,
    num_partitions: int = 4,
    ready_timeout: float = 90.0,
    extra_config: Mapping[str, str | int] | None = None,
    die_with_parent: bool = True,
    secure: SecureBroker | None = None,
) -> KafkaBroker:
    """Start a broker and wait until clients can use it.

    Free ports are picked by binding port 0 and releasing it, which leaves a
    window in which another process may grab the port; if the broker then
    fails to bind and the ports were ours to choose, it is retried on new ones.
    """
    jars = ensure_kafka_jars()
    attempts = 3 if port is None or controller_port is None else 1
    for attempt in range(1, attempts + 1):
        broker = KafkaBroker(
            data_dir,
            port,
            controller_port,
            num_partitions=num_partitions,
            jars_dir=jars,
            extra_config=extra_config,
            die_with_parent=die_with_parent,
            secure=secure,
        )
        try:
            return broker.start().wait_ready(ready_timeout)
        except BrokerStartError as exc:
            broker.stop()
            if attempt == attempts or "Address already in use" not in str(exc):
                raise
        except BaseException:
            broker.stop()
            raise
    raise AssertionError("unreachable")
