"""``[compaction]``: the strategy pipeline's order, per deployment and per tenant,
checked before anything connects."""

from __future__ import annotations

import pytest

from core.settings import ConfigError, parse_settings

pytestmark = pytest.mark.unit


def test_the_default_order_is_cheapest_first_and_a_tenant_may_name_its_own() -> None:
    settings = parse_settings({
        "compaction": {"clear_tool_results": {"keep_last": 5, "exclude_tools": ["grep"]}},
        "tenants": [{"id": "acme", "strategies": ["clear_tool_results", "summarize"]}],
    })  # fmt: skip
    config = settings.summarization.compaction(
        settings.compaction.strategy_config(settings.tenants)
    ).strategies
    assert config.for_tenant(None) == ("clear_tool_results", "offload_oversized", "summarize")
    assert config.for_tenant("other") == config.strategies
    assert config.for_tenant("acme") == ("clear_tool_results", "summarize")
    assert config.clear_tool_results.keep_last == 5
    assert config.clear_tool_results.exclude_tools == ("grep",)


@pytest.mark.parametrize(
    ("strategies", "rule"),
    [
        (["summarize", "clear_tool_results"], "summarize must be the last strategy"),
        (["clear_tool_results", "clear_tool_results"], "a strategy is named twice"),
        (["shrink"], "Input should be"),
    ],
)
def test_a_bad_order_names_the_key(strategies: list[str], rule: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings({"compaction": {"strategies": strategies}})
    assert "[compaction].strategies" in str(caught.value) and rule in str(caught.value)
