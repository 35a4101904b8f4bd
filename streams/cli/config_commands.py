"""``compactor config``: check the configuration, render its reference.

``config check`` loads the file and the environment as the worker does (``main``
hands every command the same ``load_settings``), then runs the worker's own
start-up checks, the ones that need no connection: the functions the worker
calls, not copies. It prints the effective configuration with every secret
redacted and exits 2 naming the key on a problem.

``config docs`` writes the generated part of docs/configuration.md (every key,
its default and its ``COMPACTOR_<SECTION>__<KEY>`` variable) from the settings
models; ``--check`` only compares (a unit test does the same).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from core.settings import (
    TENANTS_ENV,
    ConfigError,
    Settings,
    TenantSettings,
    env_name,
    env_overrides,
    resolve_model,
)
from streams.database import configured_dsn, explicit_addresses
from streams.http.auth import API_TOKENS_ENV, env_tokens
from streams.http.forwarding import client_ssl_context, server_ssl_context
from streams.kafka.security import kafka_security
from streams.preflight import startup_checks, worker_bootstrap
from streams.stack_state import Explicit

REDACTED = "<redacted>"
#: A key with one of these words (``_``-separated) holds a secret, unless it names
#: a variable (``*_env``) or its value is a number or a flag (``max_summary_tokens``).
SECRET_WORDS = frozenset({"token", "tokens", "password", "key", "dsn", "secret"})

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
BEGIN = "<!-- BEGIN GENERATED: compactor config docs -->"
END = "<!-- END GENERATED: compactor config docs -->"


def add_config_commands(sub: Any) -> None:
    config = sub.add_parser("config", help="check the configuration; render its reference")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser(
        "check",
        help="load the file and the environment as the worker does, run its start-up "
        "checks (no connection), print the effective configuration, secrets redacted "
        "(exit 2 on a problem)",
    )
    check.add_argument("--json", action="store_true", help="one JSON object")
    docs = config_sub.add_parser(
        "docs", help="regenerate the key reference in docs/configuration.md"
    )
    docs.add_argument("--check", action="store_true", help="only check it is up to date")


def cmd_config(settings: Settings, args: argparse.Namespace) -> int:
    if args.config_command == "docs":
        return _docs(check=args.check)
    return check_config(settings, as_json=args.json)


# -- config check ----------------------------------------------------------------


def startup_problems(settings: Settings, environ: Mapping[str, str]) -> list[str]:
    """Every start-up check of the worker that needs no connection; one message per
    failed check (each names the key)."""

    def transport_and_exposure() -> None:
        startup_checks(settings, worker_bootstrap(settings), environ)

    checks: list[Callable[[], object]] = [
        lambda: kafka_security(settings.kafka, environ),  # run_worker, create_app
        transport_and_exposure,  # build_app: brokers, transport, tokens, exposure
        lambda: server_ssl_context(settings.service),  # create_app: HTTPS
        lambda: client_ssl_context(settings.service),  # the views: forwarding
        lambda: resolve_model(settings.summarization, environ),  # WorkerRuntime
    ]
    problems = []
    for check in checks:
        try:
            check()
        except ConfigError as error:
            problems.append(str(error))
    return problems


def _is_secret(key: str) -> bool:
    return not key.endswith("_env") and bool(SECRET_WORDS & set(key.lower().split("_")))


def redact(value: Any, secret: bool = False) -> Any:
    """``value`` (``model_dump(mode="json")``) with every secret replaced."""
    if isinstance(value, dict):
        return {key: redact(item, secret or _is_secret(key)) for key, item in value.items()}
    if isinstance(value, list):
        return [redact(item, secret) for item in value]
    if secret and value is not None and not isinstance(value, bool | int | float):
        return REDACTED
    return value


def effective(settings: Settings, environ: Mapping[str, str]) -> dict[str, Any]:
    """The configuration the worker would run with, secrets redacted, and where its
    addresses and overrides come from."""
    servers = _count(lambda: worker_bootstrap(settings))
    dsn = _count(lambda: configured_dsn(settings))
    given = _count(lambda: explicit_addresses(settings))
    explicit = given if isinstance(given, Explicit) else None

    def source(value: object, explicit_value: object, named: str | None) -> str | None:
        if not value:
            return None
        return named if explicit_value else "the `compactor dev up` stack"

    return {
        "settings": redact(settings.model_dump(mode="json")),
        "kafka_bootstrap_servers": servers,
        "kafka_bootstrap_source": source(
            servers,
            explicit and explicit.kafka_bootstrap,
            explicit.kafka_source if explicit else None,
        ),
        "postgres_dsn": REDACTED if dsn else None,
        "postgres_embedded": settings.postgres.embedded,
        "postgres_dsn_source": source(
            dsn, explicit and explicit.postgres_dsn, explicit.postgres_source if explicit else None
        ),
        "env_api_tokens": _count(lambda: len(env_tokens(environ))),
        "model": _count(lambda: resolve_model(settings.summarization, environ).kind),
        "environment_overrides": sorted(var for var, _ in env_overrides(environ).values()),
    }


def _count(read: Callable[[], object]) -> object:
    try:
        return read()
    except ConfigError:
        return None  # reported as a problem


def check_config(
    settings: Settings, *, as_json: bool, environ: Mapping[str, str] | None = None
) -> int:
    env = os.environ if environ is None else environ
    problems = startup_problems(settings, env)
    report = effective(settings, env)
    if as_json:
        print(json.dumps({"ok": not problems, "problems": problems, **report}, indent=2))
    else:
        print(_text(report))
        for problem in problems:
            print(f"compactor: {problem}", file=sys.stderr)
        print("configuration OK" if not problems else f"{len(problems)} problem(s)")
    return 2 if problems else 0


def _text(report: Mapping[str, Any]) -> str:
    lines = []
    for section, values in report["settings"].items():
        tables = values if isinstance(values, list) else [values]
        for table in tables:
            lines.append(f"[[{section}]]" if isinstance(values, list) else f"[{section}]")
            lines += [f"{key} = {json.dumps(value)}" for key, value in table.items()]
            lines.append("")
    lines.append(
        f"# Kafka: {report['kafka_bootstrap_servers']} (from {report['kafka_bootstrap_source']})"
    )
    dsn = report["postgres_dsn"]
    lines.append(
        f"# PostgreSQL DSN: {dsn} (from {report['postgres_dsn_source']})"
        if dsn
        else "# PostgreSQL DSN: unset: an embedded development server ([postgres].embedded)"
        if report["postgres_embedded"]
        else "# PostgreSQL DSN: unset (refused: set POSTGRES_DSN or [postgres].dsn)"
    )
    lines.append(f"# tokens from ${API_TOKENS_ENV}: {report['env_api_tokens']}")
    lines.append(f"# summarizer: {report['model']}")
    overrides = report["environment_overrides"]
    lines.append(f"# from the environment: {', '.join(overrides) if overrides else 'nothing'}")
    return "\n".join(lines)


# -- config docs -----------------------------------------------------------------


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    return f"`{json.dumps(to_jsonable_python(value, exclude_none=True))}`"


def render_reference(model: type[BaseModel] = Settings) -> str:
    """Every key of the settings models: its default and its environment variable."""
    lines = [
        BEGIN,
        "<!-- Generated from core/settings/ by `compactor config docs`; do not edit. -->",
        "",
        "## Every key and its environment variable",
        "",
        "Each key can also be set as `COMPACTOR_<SECTION>__<KEY>` (upper case, two",
        "underscores); the environment wins over the file. Lists and tables are JSON",
        "(`COMPACTOR_SERVICE__API_TOKENS='[\"…\"]'`); other values are written as in",
        "TOML without quotes (`COMPACTOR_BUDGET__CONTEXT_BUDGET=0.5`). An unknown",
        "section or key, or a bad value, stops start-up naming the variable.",
        "",
        "| key | default | environment variable |",
        "| --- | --- | --- |",
    ]
    for section, section_field in model.model_fields.items():
        annotation = section_field.annotation
        if section == "tenants":  # a list of tables, set as a whole
            for key, field in TenantSettings.model_fields.items():
                default = _default(field).replace("|", "\\|")
                lines.append(
                    f"| `[[tenants]].{key}` | {default} | `{TENANTS_ENV}` (the list, JSON) |"
                )
            continue
        assert isinstance(annotation, type) and issubclass(annotation, BaseModel)
        for key, field in annotation.model_fields.items():
            default = _default(field).replace("|", "\\|")
            lines.append(f"| `[{section}].{key}` | {default} | `{env_name(section, key)}` |")
    lines.append(END)
    return "\n".join(lines)


def rendered_doc(text: str) -> str:
    """``text`` (docs/configuration.md) with its generated part rendered anew
    (appended when the markers are missing)."""
    block = render_reference()
    if BEGIN in text and END in text:
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        return head + block + tail
    return text.rstrip("\n") + "\n\n" + block + "\n"


def _docs(*, check: bool, path: Path = DOC) -> int:
    text = path.read_text(encoding="utf-8")
    wanted = rendered_doc(text)
    if text == wanted:
        print(f"{path}: up to date")
        return 0
    if check:
        print(f"{path} is out of date: run `compactor config docs`", file=sys.stderr)
        return 1
    path.write_text(wanted, encoding="utf-8")
    print(f"{path}: written")
    return 0
