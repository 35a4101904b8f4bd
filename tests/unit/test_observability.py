"""deploy/grafana and deploy/prometheus against the metrics the worker exports.

Every metric name a dashboard panel or an alert rule names must be one the
worker exports (streams/metrics.py, as prometheus_client names its series:
``_total`` for counters, ``_bucket`` / ``_sum`` / ``_count`` for histograms),
or one of ``EXTERNAL`` (kube-state-metrics). The names are parsed out of the
PromQL: strings, label matchers, ranges and label lists removed, the
identifiers left that are not a function, an aggregation or a keyword.

The rules are checked by promtool (``promtool check rules``, and ``promtool
test rules`` with compactor-rules.test.yml) when it is installed: skipped
without it on a developer's machine, a failure in CI (``CI=true``), where
.ci/run installs it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from streams.metrics import Metrics

pytestmark = pytest.mark.unit

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "compactor.json"
RULES = DEPLOY / "prometheus" / "compactor-rules.yml"
RULE_TESTS = DEPLOY / "prometheus" / "compactor-rules.test.yml"
# Named by the rules, exported by kube-state-metrics (the pods of deploy/kubernetes).
EXTERNAL = frozenset({"kube_pod_status_ready", "kube_pod_container_status_restarts_total"})
KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "inf", "nan", "atan2"}
)


def exported_names() -> set[str]:
    names: set[str] = set()
    for family in Metrics().registry.collect():
        if family.type == "counter":
            names |= {f"{family.name}_total", f"{family.name}_created"}
        elif family.type == "histogram":
            names |= {f"{family.name}_{suffix}" for suffix in ("bucket", "sum", "count", "created")}
        else:
            names.add(family.name)
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(
        r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text
    )  # label lists
    found = set()
    for match in re.finditer(r"(?<![A-Za-z0-9_:.$])[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or match.group() in KEYWORDS:
            continue  # a function, an aggregation, or a keyword
        found.add(match.group())
    return found


def test_metric_names_are_parsed_out_of_promql() -> None:
    assert metric_names(
        'histogram_quantile(0.95, sum by (le) (rate(a_bucket{instance=~"$i", x="b c"}[5m])))'
    ) == {"a_bucket"}
    assert metric_names(
        "sum by (topic) (lag) > 1e3 and deriv(sum by (topic) (lag)[15m:1m]) > 0 offset 5m"
    ) == {"lag"}
    assert metric_names("a / on (instance) group_left (x) b unless absent(c)") == {"a", "b", "c"}
    assert metric_names('1 - sum(rate(h_bucket{le="1.0"}[10m])) / sum(rate(h_count[10m]))') == {
        "h_bucket",
        "h_count",
    }


# -- the dashboard -------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    found: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return found


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def dashboard_exprs() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in panels() for t in p["targets"]]


def test_every_metric_a_panel_names_is_exported() -> None:
    exported = exported_names()
    for title, expr in dashboard_exprs():
        names = metric_names(expr)
        assert names, f"{title}: no metric in {expr!r}"
        assert names <= exported, f"{title}: not exported: {sorted(names - exported)}"
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            query = re.fullmatch(r"label_values\((\w+),\s*\w+\)", variable["definition"])
            assert query is not None and query.group(1) in exported


def test_the_dashboard_covers_what_an_operator_watches() -> None:
    named = set().union(*(metric_names(expr) for _, expr in dashboard_exprs()))
    wanted = {
        "compactor_events_in_total",  # ingest
        "compactor_consumer_lag",
        "compactor_compactions_started_total",
        "compactor_compactions_failed_total",
        "compactor_compaction_latency_seconds_bucket",
        "compactor_llm_calls_total",
        "compactor_llm_provider_state",
        "compactor_llm_tokens_total",
        "compactor_history_budget_ratio_bucket",
        "compactor_compactions_over_target_total",
        "compactor_dead_lettered_total",
        "compactor_watchdog_heals_total",
        "compactor_watchdog_exits_total",
        "compactor_accounting_waiting",
    }
    assert wanted <= named, sorted(wanted - named)


def test_the_dashboard_is_well_formed() -> None:
    board = dashboard()
    assert board["uid"] and board["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "instance"} <= variables
    for panel in panels():
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["description"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert 'instance=~"$instance"' in target["expr"], (panel["title"], target["expr"])


# -- the rules -----------------------------------------------------------------------


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_every_metric_a_rule_names_is_exported() -> None:
    known = exported_names() | EXTERNAL
    for rule in rules():
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= known, f"{rule['alert']}: not exported: {sorted(names - known)}"


def test_every_rule_says_what_it_means_and_what_to_do() -> None:
    alerts = [rule["alert"] for rule in rules()]
    assert len(alerts) == len(set(alerts))
    for rule in rules():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert len(rule["annotations"]["description"]) > 80, rule["alert"]
    assert {
        "CompactorConsumerLagGrowing",
        "CompactorConversationsOverBudget",
        "CompactorDeadLetters",
        "CompactorLLMProviderBreakerOpen",
        "CompactorWorkerMetricsAbsent",
        "CompactorWorkerNotReady",
        "CompactorWatchdogExited",
    } <= set(alerts)


def test_every_alert_is_unit_tested() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
    tested = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    untested = {rule["alert"] for rule in rules()} - tested
    # Rate-of-a-ratio and info alerts without a test of their own:
    assert untested <= {
        "CompactorCompactionsOverTarget",
        "CompactorWatchdogHealing",
        "CompactorCompactionsFailing",
    }


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI", "").lower() in {"true", "1", "yes"}:
            pytest.fail(
                "promtool is missing in CI: .ci/run installs it (apt-get install prometheus)"
            )
        pytest.skip(
            "promtool is not installed here (Debian: apt-get install prometheus); CI runs it"
        )
    return found


def test_promtool_checks_the_rules() -> None:
    checked = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules())} rules found" in checked.stdout


def test_promtool_unit_tests_of_the_rules_pass(tmp_path: Path) -> None:
    """Against a copy of the rules without annotations: promtool compares them exactly."""
    tool = promtool()
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    for group in document["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / RULES.name).write_text(yaml.safe_dump(document, sort_keys=False))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    tested = subprocess.run(
        [tool, "test", "rules", RULE_TESTS.name],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
