"""The image builds reproducibly: base images by digest (Dockerfile and
docker-compose.yml), every Python distribution from requirements.lock with its
hashes, setuptools included, and the package built with ``--no-build-isolation``
so pip fetches no build requirement of its own.

There is no Docker engine on these machines: the files are read as text, and
each rule is checked strictly (anything the rules do not know is refused), with
the checks themselves tried on what they must refuse.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.unit.test_lock_file import RUNTIME_LOCK, pins

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"

_BY_DIGEST = re.compile(r"^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?@sha256:[0-9a-f]{64}$")
# The only pip commands the image may run.
ALLOWED_PIP = (
    ["pip", "install", "--require-hashes", "-r", "requirements.lock"],
    ["pip", "install", "--no-index", "--no-deps", "--no-build-isolation", "."],
)
_FETCHERS = ("curl", "wget", "git", "uv", "easy_install", "pipx")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    found = []
    for line in joined.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        keyword, _, rest = stripped.partition(" ")
        found.append((keyword.upper(), rest.strip()))
    return found


def dockerfile_problems(text: str) -> list[str]:
    problems = []
    steps = instructions(text)
    if not steps or steps[0][0] != "FROM":
        problems.append("the base is not the first instruction (an ARG could change it)")
    for keyword, rest in steps:
        if keyword == "FROM":
            image = rest.split()[0]
            if not _BY_DIGEST.match(image):
                problems.append(f"FROM {image}: not by digest")
        elif keyword == "ADD":
            problems.append(f"ADD {rest}: COPY what is in the build context instead")
        elif keyword == "RUN":
            problems += _run_problems(rest)
    if not any(k == "RUN" and "--no-build-isolation" in r for k, r in steps):
        problems.append("the package is not built with --no-build-isolation")
    return problems


def _run_problems(command: str) -> list[str]:
    problems = []
    for part in re.split(r"&&|;|\|\|", command):
        words = shlex.split(part)
        if not words:
            continue
        if words[0] in _FETCHERS or "://" in part:
            problems.append(f"RUN {part.strip()}: fetches something unpinned")
        if "pip" in words[:3] and "install" in words:
            start = words.index("pip")
            if words[start:] not in [list(allowed) for allowed in ALLOWED_PIP]:
                problems.append(f"RUN {part.strip()}: not one of the pinned pip installs")
    return problems


def test_the_dockerfile_builds_from_pinned_inputs_only() -> None:
    assert dockerfile_problems(DOCKERFILE.read_text(encoding="utf-8")) == []
    steps = instructions(DOCKERFILE.read_text(encoding="utf-8"))
    # Both pip steps are there, the locked one first.
    runs = [rest for keyword, rest in steps if keyword == "RUN" and "pip install" in rest]
    assert "requirements.lock" in runs[0] and "--no-build-isolation" in runs[1], runs


@pytest.mark.parametrize(
    "text",
    [
        "FROM python:3.11-slim\n",
        "FROM python:3.11-slim@sha256:abc\n",
        "ARG BASE=python@sha256:" + "0" * 64 + "\nFROM $BASE\n",
        "FROM python@sha256:" + "0" * 64 + "\nRUN pip install --no-deps .\n",
        "FROM python@sha256:" + "0" * 64 + "\nRUN pip install -r requirements.lock\n",
        "FROM python@sha256:" + "0" * 64 + "\nRUN pip install setuptools && pip install .\n",
        "FROM python@sha256:" + "0" * 64 + "\nRUN curl -sL https://x | sh\n",
        "FROM python@sha256:" + "0" * 64 + "\nADD https://x/y.tar.gz /src\n",
    ],
)
def test_the_check_refuses_what_is_not_pinned(text: str) -> None:
    assert dockerfile_problems(text)


def test_what_builds_the_package_is_in_the_hashed_lock() -> None:
    """``--no-build-isolation`` builds with what is installed: setuptools from the
    lock, at a version the build-system table accepts, with its hashes."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        build_system: dict[str, Any] = tomllib.load(f)["build-system"]
    locked = pins(RUNTIME_LOCK)
    for spec in build_system["requires"]:
        requirement = Requirement(spec)
        version, hashes = locked[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(version), (spec, version)
        assert hashes >= 1, requirement.name
    assert build_system["build-backend"] == "setuptools.build_meta"
    build_in = (ROOT / "requirements-build.in").read_text().splitlines()
    listed = {Requirement(line).name for line in build_in if line and not line.startswith("#")}
    assert listed == {Requirement(spec).name for spec in build_system["requires"]}


def test_compose_runs_images_by_digest() -> None:
    services: dict[str, dict[str, Any]] = yaml.safe_load(COMPOSE.read_text())["services"]
    pulled = {name: s["image"] for name, s in services.items() if "build" not in s}
    assert pulled, "compose pulls the infrastructure's images"
    for name, image in pulled.items():
        assert _BY_DIGEST.match(image), f"{name}: {image} is not pinned by digest"
    for name, service in services.items():
        if "build" in service:  # the image compose builds from the Dockerfile
            assert service["build"] == "." and "@" not in service["image"], name
