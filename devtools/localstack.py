"""A real Kafka broker, or a cluster of them (KRaft), on loopback, without Docker.

Why this exists: the service's contract with Kafka (keyed partitioning,
consumer-group rebalances, offsets, exactly-once) is exactly what mocks get
wrong, and neither CI nor developer machines here have a Docker engine. The
broker's jars come from Maven Central through ``devtools/kafka/pom.xml`` (the one
registry every machine reaches; see :func:`find_kafka_pom`), are cached per
Kafka version, and the broker
runs as a plain ``java`` child process with its data under a directory the
caller owns, so several brokers (parallel test sessions, ``dev up``) never
share ports or files.

In-process::

    with start_kafka(tmp_path / "kafka") as broker:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)

From a shell (CI), in the background; prints ``KAFKA_BOOTSTRAP=127.0.0.1:PORT``
once clients can connect and stops the broker on SIGTERM or SIGINT::

    python -m devtools.localstack jars            # resolve the jars, print lib dir
    python -m devtools.localstack kafka --data-dir var/kafka --ready-file var/kafka.env &
    python -m devtools.localstack kafka --brokers 3 --data-dir var/kafka3 &   # a cluster

A cluster (``KafkaCluster``, ``start_cluster``): three KRaft nodes on
loopback, each broker and controller, topics with replication factor 3 and
``min.insync.replicas`` 2 by default; a node can be killed, stopped (a
controlled shutdown) and restarted on its ports and data.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import TracebackType
from typing import Self

from pydantic import SecretStr

from core.settings import default_min_insync
from devtools.tls import CertificateAuthority, Issued, issue, make_ca
from streams.kafka.probe import LOOPBACK, probe_brokers
from streams.kafka.security import PLAINTEXT, KafkaSecurity
from streams.stack_state import pid_alive

#: The checkout this module runs from (``docker-compose.yml`` lives there);
#: meaningless in an installed wheel, which has no checkout.
REPO_ROOT = Path(__file__).resolve().parent.parent

#: The broker's Maven pom and Log4j config are package data of ``devtools``
#: (``devtools/kafka/``): the same path in a checkout and in an installed wheel.
KAFKA_FILES_DIR = Path(__file__).resolve().parent / "kafka"
PACKAGED_KAFKA_POM = KAFKA_FILES_DIR / "pom.xml"
KAFKA_LOG4J_CONFIG = KAFKA_FILES_DIR / "log4j2.properties"
#: Another pom to resolve the broker from (another Kafka version, say).
KAFKA_POM_ENV = "COMPACTOR_KAFKA_POM"

#: Marks a jar folder whose copy finished; holds the pom's digest so that a
#: changed pom (new version, new logging backend) re-resolves.
JARS_MARKER = ".resolved"

NODE_ID = 1
MIN_JAVA_MAJOR = 17

DEFAULT_HEAP_OPTS: tuple[str, ...] = ("-Xmx512m", "-Xms256m")
#: Serial GC rather than Kafka's G1: no concurrent GC threads competing with the
#: tests for the machine's 2 cores, and a 512 MiB heap keeps its pauses short.
#: Start-up time and RSS measured the same with either.
DEFAULT_JVM_OPTS: tuple[str, ...] = (
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)

_INSTALL_HINT = (
    "install OpenJDK 17+ and Maven "
    "(Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless maven)"
)


class LocalStackError(RuntimeError):
    """Raised when the local stack cannot be prepared or started."""


class MissingToolError(LocalStackError):
    """``java`` or ``mvn`` is absent or too old: nothing here can fix that."""


class BrokerStartError(LocalStackError):
    """The broker process exited or never answered; the message has its log tail."""


class KafkaPomNotFoundError(LocalStackError):
    """No pom to resolve the broker's jars from; the message lists every place looked at."""


# --------------------------------------------------------------------------- tools


def _which(tool: str, env_var: str) -> str:
    override = os.environ.get(env_var)
    if override:
        return override
    found = shutil.which(tool)
    if found is None:
        raise MissingToolError(f"`{tool}` not found on PATH: {_INSTALL_HINT}")
    return found


@cache
def find_java() -> str:
    """Path of a ``java`` new enough for the broker (Kafka 4 needs 17+).

    Checked up front because an old JVM fails deep inside class loading with
    an ``UnsupportedClassVersionError`` that names no fix.
    """
    java = _which("java", "KAFKA_JAVA")
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError as exc:
        raise MissingToolError(f"cannot run {java}: {exc}; {_INSTALL_HINT}") from exc
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match is None:
        raise MissingToolError(f"cannot tell the version of {java}; {_INSTALL_HINT}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_xxx"
        major = int(match.group(2))
    if major < MIN_JAVA_MAJOR:
        raise MissingToolError(f"{java} is Java {major}, the broker needs 17+: {_INSTALL_HINT}")
    return java


def find_mvn() -> str:
    return _which("mvn", "KAFKA_MVN")


# --------------------------------------------------------------------------- jars


def find_kafka_pom() -> Path:
    """The pom that pins the broker and its classpath.

    ``$COMPACTOR_KAFKA_POM`` when set (and then only there: a mistyped
    override must not quietly fall back to another Kafka version), otherwise
    the pom shipped as package data of ``devtools``, which is where it lives
    in a checkout and in an installed wheel alike.
    """
    override = os.environ.get(KAFKA_POM_ENV)
    if override:
        pom, looked = Path(override).expanduser(), f"${KAFKA_POM_ENV}={override}"
    else:
        pom, looked = PACKAGED_KAFKA_POM, f"${KAFKA_POM_ENV} (unset), then {PACKAGED_KAFKA_POM}"
    if pom.is_file():
        return pom
    raise KafkaPomNotFoundError(
        f"no Kafka pom found; looked at {looked}. Point ${KAFKA_POM_ENV} at a pom "
        "(a checkout has devtools/kafka/pom.xml), or reinstall context-compactor: "
        "its devtools package ships the pom"
    )


def kafka_version(pom: Path | None = None) -> str:
    """The pinned Kafka version, read from the pom so it is stated only once."""
    pom = pom if pom is not None else find_kafka_pom()
    root = ET.parse(pom).getroot()
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = root.find("m:properties/m:kafka.version", ns)
    if node is None or not (node.text or "").strip():
        raise LocalStackError(f"{pom} has no <properties><kafka.version>")
    return (node.text or "").strip()


def default_jars_dir(version: str | None = None) -> Path:
    """Where the broker's jars live: ``$KAFKA_JARS_DIR`` or a per-version user cache."""
    override = os.environ.get("KAFKA_JARS_DIR")
    if override:
        return Path(override).expanduser()
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache_home / "context-compactor" / f"kafka-{version or kafka_version()}" / "lib"


def _pom_digest(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def jars_ready(jars_dir: Path, pom: Path | None = None) -> bool:
    pom = pom if pom is not None else find_kafka_pom()
    marker = jars_dir / JARS_MARKER
    try:
        return marker.read_text().strip() == _pom_digest(pom)
    except OSError:
        return False


def ensure_kafka_jars(
    jars_dir: Path | None = None, *, pom: Path | None = None, timeout: float = 900.0
) -> Path:
    """The folder holding the broker's classpath, resolving it with Maven first if needed.

    Resolution happens into a scratch folder that is renamed into place, under
    a file lock: two test sessions starting at once must neither run Maven
    twice into the same folder nor see a half-copied classpath.
    """
    pom = pom if pom is not None else find_kafka_pom()
    target = jars_dir if jars_dir is not None else default_jars_dir(kafka_version(pom))
    if jars_ready(target, pom):
        return target
    mvn = find_mvn()
    find_java()  # Maven needs it too; fail with the same install hint.
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{target.name}.lock"):
        if jars_ready(target, pom):
            return target
        scratch = target.parent / f".{target.name}.tmp-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        cmd = [
            mvn,
            "-q",
            "-B",
            "-Dstyle.color=never",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={scratch}",
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(scratch, ignore_errors=True)
            raise LocalStackError(f"Maven did not resolve Kafka within {timeout:.0f}s") from exc
        if proc.returncode != 0 or not any(scratch.glob("kafka_2.13-*.jar")):
            shutil.rmtree(scratch, ignore_errors=True)
            tail = _tail_text(proc.stdout + proc.stderr, 40)
            raise LocalStackError(
                f"Maven could not resolve the Kafka jars (exit {proc.returncode}):\n"
                f"$ {' '.join(cmd)}\n{tail}"
            )
        (scratch / JARS_MARKER).write_text(_pom_digest(pom) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(scratch, target)
    return target


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# --------------------------------------------------------------------------- secure broker

SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
INTER_BROKER_MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class SecureBroker:
    """What makes a local broker a secure one: a generated CA, the broker's certificate
    (``localhost`` and ``127.0.0.1``), a client certificate, and SCRAM users.

    The broker then listens with SASL_SSL (PLAIN, SCRAM-SHA-256 and -512; the
    client ``username`` has SCRAM credentials for both and a PLAIN password,
    the same one) and with SSL requiring a client certificate signed by the
    CA; brokers talk to each other over SASL_SSL as ``admin``. Everything
    lives in ``directory`` (``users.json`` holds the passwords, mode 0600) and
    is reused when it exists, since the formatted storage keeps the users.
    """

    directory: Path
    ca: CertificateAuthority
    server: Issued
    client: Issued
    username: str
    password: str
    admin_password: str

    @classmethod
    def create(cls, directory: Path, username: str = "compactor") -> SecureBroker:
        directory = directory.resolve()
        users = directory / "users.json"
        if users.exists():
            saved = json.loads(users.read_text())
            ca = CertificateAuthority(directory / "ca.pem", directory / "ca.key")
            server, client = (
                Issued(
                    directory / f"{n}.pem", directory / f"{n}.key", directory / f"{n}-bundle.pem"
                )
                for n in ("broker", "client")
            )
            return cls(directory, ca, server, client, **saved)
        ca = make_ca(directory, "ca")
        server = issue(ca, directory, "broker")
        client = issue(ca, directory, "client", dns=(), ips=())
        made = cls(
            directory, ca, server, client, username, secrets.token_hex(16), secrets.token_hex(16)
        )
        users.touch(mode=0o600)
        users.write_text(
            json.dumps(
                {
                    "username": username,
                    "password": made.password,
                    "admin_password": made.admin_password,
                }
            )
        )
        return made

    def context(self, *, client_certificate: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca.cert))
        if client_certificate:
            context.load_cert_chain(str(self.client.cert), str(self.client.key))
        return context

    def client_security(
        self, mechanism: str = "SCRAM-SHA-512", *, password: str | None = None
    ) -> KafkaSecurity:
        """How a client of the SASL_SSL listener connects (``password`` overrides, for tests)."""
        return KafkaSecurity(
            "SASL_SSL",
            self.context(),
            mechanism,
            self.username,
            SecretStr(password if password is not None else self.password),
        )

    def admin_security(self) -> KafkaSecurity:
        return KafkaSecurity(
            "SASL_SSL",
            self.context(),
            INTER_BROKER_MECHANISM,
            "admin",
            SecretStr(self.admin_password),
        )

    def format_args(self) -> list[str]:
        """``kafka-storage format --add-scram``: KRaft keeps SCRAM users in its metadata."""
        args = [f"--add-scram={INTER_BROKER_MECHANISM}=[name=admin,password={self.admin_password}]"]
        for mechanism in SCRAM_MECHANISMS:
            args.append(f"--add-scram={mechanism}=[name={self.username},password={self.password}]")
        return args

    def server_properties(self, port: int, ssl_port: int, controller_port: int) -> dict[str, str]:
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required"
        admin = f'username="admin" password="{self.admin_password}";'
        plain = (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="admin" password="{self.admin_password}" '
            f'user_admin="{self.admin_password}" user_{self.username}="{self.password}";'
        )
        return {
            "listeners": (
                f"SASL_SSL://{LOOPBACK}:{port},SSL://{LOOPBACK}:{ssl_port},"
                f"CONTROLLER://{LOOPBACK}:{controller_port}"
            ),
            "advertised.listeners": f"SASL_SSL://{LOOPBACK}:{port},SSL://{LOOPBACK}:{ssl_port}",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,SSL:SSL,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "SASL_SSL",
            "sasl.enabled.mechanisms": "PLAIN," + ",".join(SCRAM_MECHANISMS),
            "sasl.mechanism.inter.broker.protocol": INTER_BROKER_MECHANISM,
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": f"{scram} {admin}",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": f"{scram} {admin}",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": plain,
            "listener.name.ssl.ssl.client.auth": "required",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.server.bundle),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca.cert),
        }

    def client_settings(self, bootstrap: str) -> dict[str, str]:
        """``[kafka]`` keys and environment for the compactor to use the SASL_SSL listener."""
        return {
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "KAFKA_SASL_USERNAME": self.username,
            "KAFKA_SASL_PASSWORD": self.password,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "ssl_cafile": str(self.ca.cert),
        }


# --------------------------------------------------------------------------- broker


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def new_cluster_id() -> str:
    """A Kafka cluster id (base64url of a UUID), made here to spare a JVM start."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _runs_broker(pid: int, properties: Path) -> bool:
    """Whether ``pid`` is a live broker reading ``properties``.

    A stale pid file (broker killed, machine rebooted) may name a pid that
    now belongs to something else entirely.
    """
    if not pid_alive(pid):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc: trust the pid
    return str(properties).encode() in argv


def stop_process(pid: int, timeout: float = 20.0) -> bool:
    """Stop a broker this process did not start (``dev down``): SIGTERM, then SIGKILL.

    A broker leads its own process group, so the group is signalled when the
    pid leads one. Returns False if the process was already gone.
    """
    if not pid_alive(pid):
        return False
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return True
            time.sleep(0.1)
    return True


def _tail_text(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _parent_death_preexec() -> Callable[[], None] | None:
    """A pre-exec hook that has the kernel SIGKILL the broker when its parent dies.

    Without it a crashed test session leaves a JVM holding ports and half a
    gigabyte until someone notices. libc is looked up here, in the parent,
    because importing or loading anything between fork and exec can deadlock.
    Linux only; elsewhere the broker simply outlives a crashed parent.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL))

    return preexec


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
        """The broker's configuration: loopback only, tuned for tests.

        Every node is broker and controller. Alone, replication factors and
        ISR sizes are 1; in a cluster (``replication`` 3) topics default to
        three replicas with ``min.insync.replicas`` 2, internal topics
        included, so an acknowledged write (acks=all) survives the loss of any
        one node. Internal topics get few partitions and session timeouts may
        be short so that group joins and failover tests finish in seconds.
        """
        replicas = self.replication
        min_isr = default_min_insync(replicas)
        voters = ",".join(f"{node}@{LOOPBACK}:{port}" for node, port in self.quorum)
        props: dict[str, str | int] = {
            "process.roles": "broker,controller",
            "node.id": self.node_id,
            "controller.quorum.voters": voters,
            "listeners": (
                f"PLAINTEXT://{LOOPBACK}:{self.port},CONTROLLER://{LOOPBACK}:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dirs),
            "num.partitions": self.num_partitions,
            "default.replication.factor": replicas,
            "min.insync.replicas": min_isr,
            # Never elect a replica that missed acknowledged writes (the default,
            # stated because the cluster tests rely on it).
            "unclean.leader.election.enable": "false",
            "auto.create.topics.enable": "true",
            "delete.topic.enable": "true",
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": 4,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": 4,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
            "group.initial.rebalance.delay.ms": 0,
            "group.min.session.timeout.ms": 1000,
            "group.consumer.min.session.timeout.ms": 1000,
            "group.consumer.min.heartbeat.interval.ms": 500,
            # After a crash the controller waits out the dead incarnation's
            # session before accepting the restarted broker: 9 s by default.
            "broker.session.timeout.ms": 4000,
            "broker.heartbeat.interval.ms": 500,
            # A follower that stops fetching leaves the ISR after 10 s, not 30: a
            # hung (not dead) node holds up acks=all writes that long.
            "replica.lag.time.max.ms": 10000,
            "num.network.threads": 2,
            "num.io.threads": 4,
            "num.recovery.threads.per.data.dir": 1,
            "log.segment.bytes": 16 * 1024 * 1024,
            "log.index.size.max.bytes": 1024 * 1024,
            "log.cleaner.dedupe.buffer.size": 16 * 1024 * 1024,
            "log.cleaner.threads": 1,
        }
        if self.secure is not None and self.ssl_port is not None:
            props.update(
                self.secure.server_properties(self.port, self.ssl_port, self.controller_port)
            )
        props.update(self.extra_config)
        return {key: str(value) for key, value in props.items()}

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
        if other != os.getpid() and _runs_broker(other, self.properties_path):
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
                + _tail_text(proc.stdout + proc.stderr, 30)
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
                preexec_fn=_parent_death_preexec() if self.die_with_parent else None,
            )
        self.pid_path.write_text(f"{self._proc.pid}\n")
        return self

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no broker log)"
        return _tail_text(text, lines)

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


# --------------------------------------------------------------------------- cluster

#: Nodes of the local cluster: enough for replication factor 3 with
#: min.insync.replicas 2 to keep accepting writes with one node down.
CLUSTER_NODES = 3
#: The cluster's nodes compile with C1 only: a node restarts in about half
#: the time (7 s against 13-16 s measured on two loaded cores), and the
#: cluster tests restart nodes on their critical path; a test broker's
#: throughput does not need C2.
CLUSTER_JVM_OPTS: tuple[str, ...] = (*DEFAULT_JVM_OPTS, "-XX:TieredStopAtLevel=1")


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct free ports (each socket held until all are picked)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


class KafkaCluster:
    """``size`` KRaft nodes on loopback, each broker and controller (combined mode).

    Why combined rather than a separate controller quorum: three JVMs instead
    of five or six on a two-core machine, and killing a node then takes a
    controller voter with it, which a separate quorum would spare; the tests
    want that harder case. With three voters the quorum, like the data
    (replication factor 3, ``min.insync.replicas`` 2), survives any one node
    down. Production runs dedicated controllers (docs/operations.md).

    Node ``i`` lives in ``data_dir/node-i`` and keeps its ports across
    restarts, so clients reconnect to the same addresses. ``kill``, ``stop``
    and ``restart`` act on one node; ``bootstrap_servers`` lists all.
    """

    def __init__(
        self,
        data_dir: Path,
        size: int = CLUSTER_NODES,
        *,
        num_partitions: int = 4,
        jars_dir: Path | None = None,
        extra_config: Mapping[str, str | int] | None = None,
        die_with_parent: bool = True,
    ) -> None:
        if size < 1:
            raise LocalStackError(f"a cluster needs at least one node, not {size}")
        self.data_dir = Path(data_dir).resolve()
        ports = free_ports(2 * size)
        quorum = [(node, ports[size + node - 1]) for node in range(1, size + 1)]
        cluster_id = new_cluster_id()
        self.nodes = [
            KafkaBroker(
                self.data_dir / f"node-{node}",
                ports[node - 1],
                controller_port,
                num_partitions=num_partitions,
                jars_dir=jars_dir,
                extra_config=extra_config,
                die_with_parent=die_with_parent,
                node_id=node,
                quorum=quorum,
                cluster_id=cluster_id,
                replication=min(size, CLUSTER_NODES),
                jvm_opts=CLUSTER_JVM_OPTS,
            )
            for node, controller_port in quorum
        ]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.bootstrap_servers for node in self.nodes)

    def node(self, node_id: int) -> KafkaBroker:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no node {node_id} in {self!r}")

    def node_at(self, address: str) -> KafkaBroker:
        """The node whose client listener is ``host:port``."""
        for node in self.nodes:
            if node.bootstrap_servers == address:
                return node
        raise KeyError(f"no node listens on {address} in {self!r}")

    @property
    def running(self) -> list[KafkaBroker]:
        return [node for node in self.nodes if node.is_running()]

    def start(self, ready_timeout: float = 180.0) -> Self:
        """Start every node that is not running, then wait for each to serve.

        A node cannot serve before a majority of the quorum is up, so all are
        launched before any is waited on. Storage is formatted in parallel
        (one short JVM per new node), the nodes launched from this thread."""
        stopped = [node for node in self.nodes if not node.is_running()]
        errors: list[BaseException] = []

        def prepare(node: KafkaBroker) -> None:
            try:
                node.prepare()
            except BaseException as error:  # re-raised below, in the caller's thread
                errors.append(error)

        threads = [threading.Thread(target=prepare, args=(node,)) for node in stopped]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        for node in stopped:  # launched from this thread (see KafkaBroker.start)
            node.start()
        for node in stopped:
            node.wait_ready(ready_timeout)
        return self

    def kill(self, node_id: int) -> KafkaBroker:
        node = self.node(node_id)
        node.kill()
        return node

    def stop(self, node_id: int | None = None, timeout: float = 30.0) -> None:
        """One node's controlled shutdown; without ``node_id``, every node at once."""
        if node_id is not None:
            self.node(node_id).stop(timeout)
            return
        # All at once: the last ones cannot hand leadership to anybody, so a
        # controlled shutdown would only wait out its timeout.
        for node in self.nodes:
            node.kill()

    def restart(self, node_id: int, ready_timeout: float = 180.0) -> KafkaBroker:
        node = self.node(node_id)
        node.start()
        return node.wait_ready(ready_timeout)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"KafkaCluster({self.bootstrap_servers}, data_dir={self.data_dir})"


def start_cluster(
    data_dir: Path,
    size: int = CLUSTER_NODES,
    *,
    num_partitions: int = 4,
    ready_timeout: float = 180.0,
    extra_config: Mapping[str, str | int] | None = None,
    die_with_parent: bool = True,
) -> KafkaCluster:
    """Start a ``size``-node cluster and wait until every node serves clients.

    Retried on new ports (fresh storage) if a port was taken between picking
    it and the JVM binding it."""
    jars = ensure_kafka_jars()
    for attempt in range(1, 4):
        cluster = KafkaCluster(
            data_dir / f"attempt-{attempt}",
            size,
            num_partitions=num_partitions,
            jars_dir=jars,
            extra_config=extra_config,
            die_with_parent=die_with_parent,
        )
        try:
            return cluster.start(ready_timeout)
        except BrokerStartError as exc:
            cluster.stop()
            if attempt == 3 or "Address already in use" not in str(exc):
                raise
        except BaseException:
            cluster.stop()
            raise
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- CLI


def _run_foreground(args: argparse.Namespace) -> int:
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)

    if args.brokers > 1:
        return _run_cluster_foreground(args, stop)
    started = time.monotonic()
    secure = SecureBroker.create(Path(args.data_dir) / "tls") if args.secure else None
    broker = start_kafka(
        Path(args.data_dir),
        args.port,
        args.controller_port,
        num_partitions=args.partitions,
        ready_timeout=args.ready_timeout,
        secure=secure,
    )
    try:
        line = f"KAFKA_BOOTSTRAP={broker.bootstrap_servers}"
        if secure is not None:
            # The passwords stay in users.json (0600); clients get told where.
            line += (
                f"\nKAFKA_SECURITY_PROTOCOL=SASL_SSL\nKAFKA_SSL_CAFILE={secure.ca.cert}"
                f"\nKAFKA_SASL_USERNAME={secure.username}"
                f"\nKAFKA_SASL_PASSWORD_FILE={secure.directory / 'users.json'}"
                f"\nKAFKA_SSL_BOOTSTRAP={broker.ssl_bootstrap_servers}"
            )
        _write_ready_file(args.ready_file, f"{line}\nKAFKA_PID={broker.pid}\n")
        print(line, flush=True)
        print(
            f"kafka ready in {time.monotonic() - started:.1f}s "
            f"(pid {broker.pid}, log {broker.log_path})",
            file=sys.stderr,
            flush=True,
        )
        while not stop.wait(0.5):
            if not broker.is_running():
                print(f"kafka broker died:\n{broker.log_tail()}", file=sys.stderr, flush=True)
                return 1
        return 0
    finally:
        broker.stop()
        if args.ready_file:
            Path(args.ready_file).unlink(missing_ok=True)


def _write_ready_file(path: str | None, text: str) -> None:
    if not path:
        return
    ready = Path(path)
    ready.parent.mkdir(parents=True, exist_ok=True)
    tmp = ready.with_name(f".{ready.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, ready)


def _run_cluster_foreground(args: argparse.Namespace, stop: threading.Event) -> int:
    """``kafka --brokers N``: a cluster until SIGTERM/SIGINT; exits 1 if a node dies."""
    if args.secure or args.port is not None or args.controller_port is not None:
        raise LocalStackError("--brokers > 1 takes neither --secure nor fixed ports")
    started = time.monotonic()
    cluster = start_cluster(
        Path(args.data_dir),
        args.brokers,
        num_partitions=args.partitions,
        ready_timeout=args.ready_timeout,
    )
    try:
        line = f"KAFKA_BOOTSTRAP={cluster.bootstrap_servers}"
        pids = ",".join(str(node.pid) for node in cluster.nodes)
        _write_ready_file(args.ready_file, f"{line}\nKAFKA_PIDS={pids}\n")
        print(line, flush=True)
        print(
            f"kafka cluster of {args.brokers} ready in {time.monotonic() - started:.1f}s "
            f"(pids {pids}, logs {cluster.data_dir}/node-*/broker.log)",
            file=sys.stderr,
            flush=True,
        )
        while not stop.wait(0.5):
            for node in cluster.nodes:
                if not node.is_running():
                    print(
                        f"kafka node {node.node_id} died:\n{node.log_tail()}",
                        file=sys.stderr,
                        flush=True,
                    )
                    return 1
        return 0
    finally:
        cluster.stop()
        if args.ready_file:
            Path(args.ready_file).unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.localstack", description="Local Kafka for tests and dev."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("jars", help="resolve the broker jars (Maven) and print their folder")
    kafka = sub.add_parser("kafka", help="run a broker in the foreground until SIGTERM/SIGINT")
    kafka.add_argument("--data-dir", required=True, help="broker files; reused across runs")
    kafka.add_argument("--port", type=int, default=None, help="client port (default: free)")
    kafka.add_argument("--controller-port", type=int, default=None)
    kafka.add_argument("--partitions", type=int, default=4, help="num.partitions")
    kafka.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="nodes (KRaft, each broker and controller); 3: replication factor 3, "
        "min.insync.replicas 2",
    )
    kafka.add_argument("--ready-timeout", type=float, default=90.0)
    kafka.add_argument(
        "--secure",
        action="store_true",
        help="SASL_SSL (SCRAM, PLAIN) and SSL (client certificates) listeners with a CA "
        "generated in DATA_DIR/tls, instead of PLAINTEXT",
    )
    kafka.add_argument(
        "--ready-file", default=None, help="write KAFKA_BOOTSTRAP=... here once ready"
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "jars":
            print(ensure_kafka_jars())
            return 0
        return _run_foreground(args)
    except LocalStackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
