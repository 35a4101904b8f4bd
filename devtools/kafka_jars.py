"""The broker's classpath: ``java`` and ``mvn`` found, the pom read, the jars resolved.

The jars come from Maven Central through ``devtools/kafka/pom.xml`` (the one
registry every machine reaches; see :func:`find_kafka_pom`) and are cached
per Kafka version, so a broker starts without a download after the first.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from devtools.kafka_errors import KafkaPomNotFoundError, LocalStackError, MissingToolError
from devtools.processes import tail_text

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

MIN_JAVA_MAJOR = 17

_INSTALL_HINT = (
    "install OpenJDK 17+ and Maven "
    "(Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless maven)"
)

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
        _copy_dependencies(mvn, pom, scratch, timeout)
        (scratch / JARS_MARKER).write_text(_pom_digest(pom) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(scratch, target)
    return target


def _copy_dependencies(mvn: str, pom: Path, scratch: Path, timeout: float) -> None:
    """Maven copies the pom's runtime classpath into ``scratch`` (removed if it fails)."""
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
        tail = tail_text(proc.stdout + proc.stderr, 40)
        raise LocalStackError(
            f"Maven could not resolve the Kafka jars (exit {proc.returncode}):\n"
            f"$ {' '.join(cmd)}\n{tail}"
        )


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
