"""Where the local broker's pom is found: ``$COMPACTOR_KAFKA_POM``, else the packaged one.

Why: the pom pins the Kafka version and classpath the launcher resolves with
Maven. It ships as package data of ``devtools`` so that an installed wheel,
which has no source tree around it, finds it as a checkout does; and when it
is missing, the error must say where it looked rather than surface as a bare
``FileNotFoundError`` from Maven or the XML parser.
"""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from devtools import kafka_jars
from devtools.localstack import (
    KAFKA_LOG4J_CONFIG,
    KAFKA_POM_ENV,
    PACKAGED_KAFKA_POM,
    KafkaPomNotFoundError,
    find_kafka_pom,
    kafka_version,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_without_override_the_packaged_pom_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KAFKA_POM_ENV, raising=False)
    assert find_kafka_pom() == PACKAGED_KAFKA_POM
    assert PACKAGED_KAFKA_POM.is_file() and KAFKA_LOG4J_CONFIG.is_file()
    assert kafka_version()  # the pinned version reads from it


def test_the_override_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pom = tmp_path / "other-pom.xml"
    pom.write_text(
        '<project xmlns="http://maven.apache.org/POM/4.0.0">'
        "<properties><kafka.version>9.9.9</kafka.version></properties></project>"
    )
    monkeypatch.setenv(KAFKA_POM_ENV, str(pom))
    assert find_kafka_pom() == pom
    assert kafka_version() == "9.9.9"


def test_a_missing_override_is_an_error_not_a_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "typo.xml"
    monkeypatch.setenv(KAFKA_POM_ENV, str(missing))
    with pytest.raises(KafkaPomNotFoundError) as caught:
        find_kafka_pom()
    message = str(caught.value)
    assert f"${KAFKA_POM_ENV}={missing}" in message
    assert str(PACKAGED_KAFKA_POM) not in message  # not looked at: the override is final


def test_without_any_pom_the_error_lists_every_place_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KAFKA_POM_ENV, raising=False)
    absent = tmp_path / "site-packages" / "devtools" / "kafka" / "pom.xml"
    monkeypatch.setattr(kafka_jars, "PACKAGED_KAFKA_POM", absent)
    with pytest.raises(KafkaPomNotFoundError) as caught:
        kafka_version()
    message = str(caught.value)
    assert f"${KAFKA_POM_ENV} (unset), then {absent}" in message
    assert "reinstall context-compactor" in message


def test_the_pom_and_log4j_config_are_package_data() -> None:
    """What the wheel ships: ``[tool.setuptools.package-data]`` must cover both files."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "devtools*" in config["packages"]["find"]["include"]
    patterns = config["package-data"]["devtools"]
    package_dir = ROOT / "devtools"
    for path in (PACKAGED_KAFKA_POM, KAFKA_LOG4J_CONFIG):
        relative = path.relative_to(package_dir).as_posix()
        assert any(fnmatch(relative, pattern) for pattern in patterns), relative
