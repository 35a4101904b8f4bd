from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from core.settings import (
    ConfigError,
    Settings,
    TenantSettings,
    load_settings,
    parse_settings,
    resolve_model,
)

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "config.toml.example"


def test_defaults_are_the_seeds() -> None:
    s = Settings().summarization
    assert (s.chunk_size, s.keep_recent, s.max_summary_tokens, s.clip_first, s.clip_last) == (
        20,
        5,
        1024,
        2,
        2,
    )
    scoring = s.scoring()
    assert (
        scoring.role_weight_system,
        scoring.role_weight_user,
        scoring.role_weight_assistant,
    ) == (10, 5, 3)
    assert (scoring.recency_decay, scoring.question_bonus, scoring.tool_call_bonus) == (
        0.95,
        2.0,
        4.0,
    )
    assert (scoring.keyword_bonus, scoring.content_length_weight) == (1.5, 1.0)
    assert len(scoring.important_keywords) == 8
    assert s.prompt is None


def test_scoring_customisable_from_toml__compaction_v2_AC3_5(tmp_path: Path) -> None:
    file = tmp_path / "config.toml"
    file.write_text(
        "[summarization]\nrole_weight_assistant = 7.5\nrecency_decay = 0.5\n"
        'important_keywords = ["outage"]\nprompt = "Be brief."\nchunk_size = 8\n'
    )
    settings = load_settings(file)
    compaction = settings.summarization.compaction()
    assert compaction.scoring.role_weight_assistant == 7.5
    assert compaction.scoring.recency_decay == 0.5
    assert compaction.scoring.important_keywords == ("outage",)
    assert compaction.prompt == "Be brief."
    assert compaction.chunk_size == 8


def test_invalid_values_name_key_value_and_rule() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings(
            {"summarization": {"chunk_size": 0, "colour": "red"}, "budget": {"context_budget": 1.5}}
        )
    text = str(caught.value)
    assert "[summarization].chunk_size = 0: Input should be greater than or equal to 1" in text
    assert "[summarization].colour: unknown key" in text
    assert "[budget].context_budget = 1.5" in text


def test_bad_toml_and_missing_file_are_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[summarization\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "nope.toml")


def test_dsn_must_be_postgres_url() -> None:
    # Named with its rule, not echoed: a DSN may carry a password.
    with pytest.raises(ConfigError, match=r"\[postgres\]\.dsn: .*postgresql://") as caught:
        parse_settings({"postgres": {"dsn": "mysql://x"}})
    assert "mysql://x" not in str(caught.value)


def test_example_file_is_valid_and_matches_defaults() -> None:
    assert load_settings(EXAMPLE) == Settings()


def _sections() -> list[tuple[str, type[BaseModel]]]:
    """Every section and its model; ``[[tenants]]`` (a list of tables) by its entry's."""
    out: list[tuple[str, type[BaseModel]]] = []
    for section, field in Settings.model_fields.items():
        model = TenantSettings if section == "tenants" else field.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        out.append((section, model))
    return out


def test_every_setting_is_documented_in_the_example() -> None:
    text = EXAMPLE.read_text()
    for section, model in _sections():
        assert f"[{section}]" in text
        for key in model.model_fields:
            assert f"\n{key} =" in text or f"\n# {key} =" in text, f"[{section}].{key} undocumented"


def test_auto_provider_prefers_anthropic_then_openai_then_extractive() -> None:
    s = Settings().summarization
    assert resolve_model(s, {"ANTHROPIC_API_KEY": "a", "OPENAI_API_KEY": "o"}).kind == "anthropic"
    assert resolve_model(s, {"OPENAI_API_KEY": "o"}).kind == "openai"
    fallback = resolve_model(s, {})
    assert fallback.kind == "extractive"
    assert "no API key" in fallback.reason


def test_explicit_provider_without_key_is_an_error_naming_the_variable() -> None:
    s = parse_settings({"summarization": {"provider": "anthropic"}}).summarization
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        resolve_model(s, {})


def test_local_openai_compatible_server_needs_no_key() -> None:
    s = parse_settings(
        {
            "summarization": {
                "provider": "openai",
                "base_url": "http://127.0.0.1:8000/v1",
                "model": "llama",
            }
        }
    ).summarization
    resolved = resolve_model(s, {})
    assert (resolved.kind, resolved.model, resolved.base_url) == (
        "openai",
        "llama",
        "http://127.0.0.1:8000/v1",
    )


def test_api_key_is_not_in_repr() -> None:
    resolved = resolve_model(Settings().summarization, {"ANTHROPIC_API_KEY": "sk-secret"})
    assert "sk-secret" not in repr(resolved)


def test_every_setting_is_in_the_configuration_reference() -> None:
    text = (EXAMPLE.parent / "docs" / "configuration.md").read_text()
    for section, model in _sections():
        assert f"## [{section}]" in text or f"## [[{section}]]" in text
        for key in model.model_fields:
            short = key.removeprefix("role_weight_")
            assert f"`{key}`" in text or f"_{short}`" in text or f"/ `{key}`" in text, (
                f"[{section}].{key} missing"
            )


def test_provider_guard_and_target_keys_reach_the_compactor() -> None:
    from core.compaction.factory import guard_limits

    settings = parse_settings(
        {
            "summarization": {
                "max_concurrent_llm_calls": 3,
                "provider_failure_threshold": 7,
                "provider_cooldown_seconds": 2.5,
                "provider_max_cooldown_seconds": 40,
                "provider_max_wait_seconds": 0,
            },
            "budget": {"context_budget": 0.5, "model_max_tokens": 2001, "target_ratio": 0.75},
        }
    )
    limits = guard_limits(settings.summarization.compaction())
    assert (limits.max_concurrent, limits.failure_threshold) == (3, 7)
    assert (limits.cooldown_seconds, limits.max_cooldown_seconds) == (2.5, 40)
    assert limits.max_wait_seconds == 0
    assert (settings.budget.budget_tokens, settings.budget.target_tokens) == (1000, 750)
    defaults = guard_limits(Settings().summarization.compaction())
    assert (defaults.max_concurrent, defaults.failure_threshold) == (64, 5)
    assert Settings().budget.target_ratio == 0.8
    with pytest.raises(ConfigError, match=r"\[budget\]\.target_ratio = 0"):
        parse_settings({"budget": {"target_ratio": 0}})


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("kafka", "sasl_password", 12345),
        ("postgres", "dsn", "mysql://app:hunter2@db/x"),
        ("service", "api_tokens", "s3cret-token"),
    ],
)
def test_a_bad_secret_value_is_named_but_never_echoed(
    section: str, key: str, value: object
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings({section: {key: value}})
    assert f"[{section}].{key}" in str(caught.value)
    assert str(value) not in str(caught.value)
