"""Every setting from the environment (``COMPACTOR_<SECTION>__<KEY>``), ``compactor
config check`` and the generated key reference in docs/configuration.md.

Why: a container is configured by its environment; a misspelt variable that is
silently ignored leaves the service running with a default nobody chose, and a
check that prints the configuration must never print its secrets.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from core.settings import ConfigError, Settings, config_path, load_settings, parse_settings
from streams import cli
from streams.addresses import configured_bootstrap
from streams.cli.config_commands import DOC, redact, rendered_doc
from streams.database import configured_dsn
from streams.http.auth import AuthPolicy

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_CONFIG = ROOT / "infra" / "compose" / "worker.toml"
TOKEN = "Zq8rT2vX9mLp4sKd7wBn3hYc6fJg1eUa"
PASSWORD = "pg-pass-Secret-42"
COMPOSE_ENV = {
    "KAFKA_BOOTSTRAP_SERVERS": "kafka:29092",
    "POSTGRES_DSN": f"postgresql://compactor:{PASSWORD}@postgres:5432/compactor",
    "COMPACTOR_CONFIG": str(COMPOSE_CONFIG),
}


@pytest.fixture(autouse=True)
def _no_outside_configuration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("COMPACTOR_") or name in ("KAFKA_BOOTSTRAP_SERVERS", "POSTGRES_DSN"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no ./config.toml


def test_a_nested_key_from_the_environment_wins_over_the_file(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text("[budget]\ncontext_budget = 0.9\n[service]\nweb_port = 6000\n")
    env = {"COMPACTOR_BUDGET__CONTEXT_BUDGET": "0.5", "COMPACTOR_SERVICE__WEB_PORT": "7000"}
    settings = load_settings(file, env)
    assert settings.budget.context_budget == 0.5
    assert settings.service.web_port == 7000
    assert load_settings(file, {}).budget.context_budget == 0.9
    # Without a file too, and from the process's environment by default.
    assert load_settings(None, env).service.web_port == 7000


def test_the_process_environment_is_read_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTOR_SUMMARIZATION__CHUNK_SIZE", "8")
    monkeypatch.setenv("COMPACTOR_KAFKA__SSL_CHECK_HOSTNAME", "false")
    settings = load_settings()
    assert settings.summarization.chunk_size == 8
    assert settings.kafka.ssl_check_hostname is False


def test_a_list_is_json() -> None:
    other = "Other-token-0123456789abcdef"
    env = {
        "COMPACTOR_SERVICE__API_TOKENS": json.dumps([TOKEN, other]),
        "COMPACTOR_SUMMARIZATION__IMPORTANT_KEYWORDS": '["outage", "rollback"]',
        "COMPACTOR_SERVICE__TOKENS": json.dumps([{"token": other + "x", "tenant": "acme"}]),
    }
    settings = load_settings(None, env)
    assert [t.get_secret_value() for t in settings.service.api_tokens] == [TOKEN, other]
    assert settings.summarization.important_keywords == ("outage", "rollback")
    assert settings.service.tokens[0].tenant == "acme"


def test_an_unknown_key_or_section_names_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"COMPACTOR_BUDGET__NOPE: unknown key \[budget\]\.nope"):
        load_settings(None, {"COMPACTOR_BUDGET__NOPE": "1"})
    with pytest.raises(ConfigError, match="COMPACTOR_BUDGETS__CONTEXT_BUDGET: unknown section"):
        load_settings(None, {"COMPACTOR_BUDGETS__CONTEXT_BUDGET": "0.5"})


def test_a_bad_value_names_the_variable_and_never_echoes_a_secret() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(COMPOSE_CONFIG, {"COMPACTOR_SERVICE__WEB_PORT": "seventy"})
    assert "COMPACTOR_SERVICE__WEB_PORT ([service].web_port) = 'seventy'" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        load_settings(None, {"COMPACTOR_POSTGRES__DSN": f"mysql://u:{PASSWORD}@db/x"})
    assert "COMPACTOR_POSTGRES__DSN ([postgres].dsn)" in str(caught.value)
    assert PASSWORD not in str(caught.value)
    # A file's own mistakes are still named by key only.
    with pytest.raises(ConfigError, match=r"  \[budget\]\.context_budget = 1.5"):
        parse_settings({"budget": {"context_budget": 1.5}}, environ={})


def test_the_existing_variables_work_and_win_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTOR_KAFKA__BOOTSTRAP_SERVERS", "from-settings-env:9092")
    monkeypatch.setenv("COMPACTOR_POSTGRES__DSN", "postgresql://a@settings-env/db")
    settings = load_settings()
    assert configured_bootstrap(settings) == "from-settings-env:9092"
    assert configured_dsn(settings) == "postgresql://a@settings-env/db"
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "legacy:9092")
    monkeypatch.setenv("POSTGRES_DSN", "postgresql://a@legacy/db")
    assert configured_bootstrap(settings) == "legacy:9092"
    assert configured_dsn(settings) == "postgresql://a@legacy/db"
    # COMPACTOR_API_TOKENS (comma-separated) and COMPACTOR_CONFIG are no settings keys.
    env = {"COMPACTOR_API_TOKENS": TOKEN, "COMPACTOR_CONFIG": str(COMPOSE_CONFIG)}
    settings = load_settings(None, env)
    assert settings.service.web_host == "0.0.0.0"
    assert settings.service.api_tokens == ()
    assert AuthPolicy.of(settings.service, env).enabled


def test_only_exact_settings_variables_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lower-case name or a whole section as one variable sets nothing (as documented),
    and ``Settings()`` is the defaults whatever the process's environment says."""
    env = {
        "compactor_budget__context_budget": "0.5",
        "COMPACTOR_SERVICE": json.dumps({"web_port": 7000}),
    }
    assert load_settings(None, env) == Settings()
    monkeypatch.setenv("COMPACTOR_BUDGET__CONTEXT_BUDGET", "0.5")
    assert Settings().budget.context_budget == 0.8
    assert load_settings().budget.context_budget == 0.5


def test_a_table_from_the_environment_replaces_the_files() -> None:
    file = {"usage": {"prices": {"mine": {"input": 1, "output": 2}}}}
    env = {"COMPACTOR_USAGE__PRICES": json.dumps({"other": {"input": 3, "output": 4}})}
    prices = parse_settings(file, environ=env).usage.prices
    assert list(prices) == ["other"]  # not merged with the file's table
    assert (prices["other"].input, prices["other"].output) == (3, 4)


def test_a_list_that_is_not_json_is_a_bad_value_naming_the_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, {"COMPACTOR_SERVICE__API_TOKENS": f"[{TOKEN}"})
    assert "COMPACTOR_SERVICE__API_TOKENS ([service].api_tokens)" in str(caught.value)
    assert TOKEN not in str(caught.value)


def test_config_path_is_the_file_load_settings_reads(tmp_path: Path) -> None:
    assert config_path(None, {}) is None  # the defaults
    assert config_path(None, {"COMPACTOR_CONFIG": "a.toml"}) == Path("a.toml")
    assert config_path("b.toml", {"COMPACTOR_CONFIG": "a.toml"}) == Path("b.toml")
    (tmp_path / "config.toml").write_text("[service]\nweb_port = 6001\n")  # the cwd's
    assert config_path(None, {}) == Path("config.toml")
    assert load_settings(None, {}).service.web_port == 6001


def run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str, **env: str
) -> tuple[int, str, str]:
    for name, value in {**COMPOSE_ENV, **env}.items():
        monkeypatch.setenv(name, value)
    code = cli.main(["config", "check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_config_check_of_the_compose_worker_with_its_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run(capsys, monkeypatch, COMPACTOR_API_TOKENS=TOKEN)
    assert code == 0, err
    assert 'web_host = "0.0.0.0"' in out
    assert "# Kafka: kafka:29092 (from $KAFKA_BOOTSTRAP_SERVERS)" in out
    assert "# tokens from $COMPACTOR_API_TOKENS: 1" in out
    assert "configuration OK" in out
    assert TOKEN not in out + err
    assert PASSWORD not in out + err


def test_config_check_without_the_token_exits_2_naming_the_key(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(capsys, monkeypatch)
    assert code == 2
    assert "[service].web_host = '0.0.0.0' is not a loopback address" in err
    assert "COMPACTOR_API_TOKENS" in err


def test_config_check_json_parses_and_holds_no_secret(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = "Metrics-token-0123456789abcdef"
    code, out, _ = run(
        capsys,
        monkeypatch,
        "--json",
        COMPACTOR_API_TOKENS=TOKEN,
        COMPACTOR_SERVICE__METRICS_TOKEN=metrics,
        COMPACTOR_SERVICE__API_TOKENS=json.dumps(["Second-token-0123456789abcdef"]),
    )
    assert code == 0
    report = json.loads(out)
    assert report["ok"] is True and report["problems"] == []
    assert report["settings"]["service"]["metrics_token"] == "<redacted>"
    assert report["settings"]["service"]["api_tokens"] == ["<redacted>"]
    assert report["settings"]["service"]["web_port"] == 6066
    assert report["postgres_dsn"] == "<redacted>"
    assert report["environment_overrides"] == [
        "COMPACTOR_SERVICE__API_TOKENS",
        "COMPACTOR_SERVICE__METRICS_TOKEN",
    ]
    for secret in (TOKEN, metrics, "Second-token", PASSWORD):
        assert secret not in out


def test_config_check_reports_every_failed_check(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = run(
        capsys,
        monkeypatch,
        "--json",
        COMPACTOR_SERVICE__TLS_CERTFILE="/nowhere/cert.pem",
        COMPACTOR_KAFKA__SSL_CAFILE="/nowhere/ca.pem",
    )
    assert code == 2
    problems = "\n".join(json.loads(out)["problems"])
    assert "[service].tls_keyfile is needed too" in problems
    assert "[kafka].ssl_cafile is set but security_protocol = 'PLAINTEXT'" in problems
    assert "[service].web_host" in problems


def test_redaction_keeps_counts_flags_and_variable_names() -> None:
    assert redact(
        {"s": {"max_summary_tokens": 10, "api_key_env": "X", "sasl_password": "p", "dsn": None}}
    ) == {
        "s": {
            "max_summary_tokens": 10,
            "api_key_env": "X",
            "sasl_password": "<redacted>",
            "dsn": None,
        }
    }


def test_the_configuration_reference_is_generated_from_the_settings() -> None:
    """Fails when a key is added without `compactor config docs` (which rewrites it)."""
    text = DOC.read_text(encoding="utf-8")
    assert text == rendered_doc(text), "docs/configuration.md is stale: run `compactor config docs`"
    for name in ("COMPACTOR_BUDGET__CONTEXT_BUDGET", "COMPACTOR_SERVICE__API_TOKENS"):
        assert f"`{name}`" in text
