"""docker-compose.yml's worker starts: the worker's own start-up checks, run on the
environment and the mounted config the compose file gives it.

Why: there is no Docker engine on these machines, and the security work once
made the compose worker exit 2 at start (no API token, ``web_host =
"0.0.0.0"``) so ``restart: unless-stopped`` looped for ever without any test
noticing. This test reads the compose file as compose would (its variable
interpolation, by hand below: compose's own implementation is Go, and the
Python ``docker-compose`` v1 package is retired), then calls
``streams.preflight.startup_checks``, the function ``build_app`` calls before
anything connects.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.settings import ConfigError, load_settings
from streams.http.probes import PROBE_PATHS
from streams.preflight import startup_checks

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
TOKEN = "a-token-chosen-by-the-operator-0123456789"

_VARIABLE = re.compile(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|\$(?P<bare>\w+)")


class MissingVariable(Exception):
    pass


def interpolate(value: str, environ: Mapping[str, str]) -> str:
    """Compose's interpolation: ``$$``, ``$VAR``, ``${VAR}``, ``${VAR:-default}``,
    ``${VAR-default}``, ``${VAR:?error}``, ``${VAR?error}``."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("name") or match.group("bare")
        op, arg = match.group("op"), match.group("arg") or ""
        current = environ.get(name)
        unset = current is None or (op is not None and op.startswith(":") and current == "")
        if op in (":-", "-"):
            return arg if unset else str(current)
        if op in (":?", "?"):
            if unset:
                raise MissingVariable(f"{name}: {arg}")
            return str(current)
        return current or ""

    return _VARIABLE.sub(substitute, value)


def worker_service() -> dict[str, Any]:
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    service: dict[str, Any] = compose["services"]["worker"]
    return service


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    return {
        key: interpolate(str(value), environ)
        for key, value in worker_service()["environment"].items()
    }


def mounted_config(environment: Mapping[str, str]) -> Path:
    """The host file mounted where the worker's COMPACTOR_CONFIG points."""
    target = environment["COMPACTOR_CONFIG"]
    for volume in worker_service()["volumes"]:
        source, _, rest = str(volume).partition(":")
        if rest.split(":")[0] == target:
            return (ROOT / source).resolve()
    raise AssertionError(f"nothing is mounted at {target}")


def run_startup_checks(environ: Mapping[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    environment = worker_environment(environ)
    for key in list(environment):
        monkeypatch.setenv(key, environment[key])
    settings = load_settings(mounted_config(environment))
    startup_checks(settings, environment["KAFKA_BOOTSTRAP_SERVERS"], environment)


def test_the_compose_worker_passes_its_startup_checks_with_a_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_startup_checks({"COMPACTOR_API_TOKENS": TOKEN}, monkeypatch)


def test_compose_refuses_to_start_without_a_token_and_says_which_variable() -> None:
    with pytest.raises(MissingVariable, match="COMPACTOR_API_TOKENS: set COMPACTOR_API_TOKENS"):
        worker_environment({})


def test_without_its_token_the_worker_itself_would_refuse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What today's file would have done, had compose let it through: exit 2."""
    monkeypatch.delenv("COMPACTOR_API_TOKENS", raising=False)
    environment = worker_environment({"COMPACTOR_API_TOKENS": TOKEN})
    environment.pop("COMPACTOR_API_TOKENS")
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    settings = load_settings(mounted_config(environment))
    with pytest.raises(ConfigError, match=r"\[service\].web_host"):
        startup_checks(settings, environment["KAFKA_BOOTSTRAP_SERVERS"], environment)


def test_no_secret_for_the_api_has_a_default_in_the_file() -> None:
    raw = worker_service()["environment"]["COMPACTOR_API_TOKENS"]
    assert re.fullmatch(r"\$\{COMPACTOR_API_TOKENS:\?[^}]+\}", raw), raw


def test_the_healthcheck_asks_an_open_probe() -> None:
    """A probe that needs no token: /healthz answers 401 to a healthcheck without one."""
    command = " ".join(worker_service()["healthcheck"]["test"])
    paths = re.findall(r"http://127\.0\.0\.1:6066(/\w+)", command)
    assert paths and set(paths) <= PROBE_PATHS, command


@pytest.mark.parametrize(
    ("template", "environ", "expected"),
    [
        ("${A:-x}", {}, "x"),
        ("${A:-x}", {"A": ""}, "x"),
        ("${A-x}", {"A": ""}, ""),
        ("${A}", {"A": "v"}, "v"),
        ("$A-$$", {"A": "v"}, "v-$"),
    ],
)
def test_interpolation_follows_compose(
    template: str, environ: dict[str, str], expected: str
) -> None:
    assert interpolate(template, environ) == expected
