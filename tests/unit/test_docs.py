"""docs/acceptance.md must stay true: every seed AC mapped, every named test real."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from core.domain.tokens import estimate_history_tokens
from core.settings import load_settings
from streams.cli.replay import read_events
from tests.support.walkthrough import walkthrough_steps

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SEEDS = ROOT.parent / "shared" / "seeds"
AC_ID = re.compile(r"\b(?:context-compaction|compaction-v2)\.AC\d+\.\d+\b")
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def test_every_seed_ac_is_mapped() -> None:
    if not SEEDS.is_dir():
        pytest.skip("shared/seeds not beside the checkout")
    in_seeds = {m for f in SEEDS.glob("*.txt") for m in AC_ID.findall(f.read_text())}
    mapped = set(AC_ID.findall((ROOT / "docs" / "acceptance.md").read_text()))
    assert in_seeds, "no AC ids found in the seeds"
    assert sorted(in_seeds - mapped) == []


def test_every_named_test_exists() -> None:
    text = (ROOT / "docs" / "acceptance.md").read_text()
    refs = TEST_REF.findall(text)
    assert len(refs) > 40
    for path, name in refs:
        tree = ast.parse((ROOT / path).read_text())
        names = {
            n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        assert name in names, f"{path}::{name} named in docs/acceptance.md does not exist"


def test_the_readme_walkthrough_budget_is_crossed_by_its_sample() -> None:
    """The walk-through (run for real by tests/e2e/test_walkthrough.py) starts on a fresh
    clone and its worker's budget is one the replayed sample goes over: on the default
    budget nothing is compacted and `tail` waits forever."""
    steps = walkthrough_steps()
    assert steps[0].argv == ("./scripts/setup",), "a fresh clone has no .venv before setup"
    [worker] = [s for s in steps if s.compactor_command() == "worker"]
    [replay] = [s for s in steps if s.compactor_command() == "replay"]
    config = worker.config()
    assert config is not None, f"`{worker.line}` runs on the default budget"
    budget = load_settings(ROOT / config, environ={}).budget.budget_tokens
    sample = read_events(ROOT / replay.argv[-1])
    assert not sample.bad
    tokens = estimate_history_tokens(e.to_message() for e in sample.events)
    assert tokens > 1.5 * budget, f"sample {tokens} tokens, budget {budget}"


def test_every_alert_is_explained_in_the_readme_and_operations() -> None:
    rules = (ROOT / "deploy" / "prometheus" / "compactor-rules.yml").read_text()
    alerts = re.findall(r"^\s*- alert: (\w+)", rules, re.MULTILINE)
    assert len(alerts) > 5
    for doc in ("README.md", "docs/operations.md"):
        text = (ROOT / doc).read_text()
        missing = [a for a in alerts if f"`{a}`" not in text]
        assert missing == [], f"{doc} does not explain these alerts: {missing}"


def test_the_readme_python_examples_call_the_client_as_it_is() -> None:
    """Each Python block of the README parses, and every ``client.<method>(...)``
    it calls exists on CompactorClient with the keyword arguments it passes."""
    import inspect

    from streams.client import CompactorClient

    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    calls = [
        node
        for block in blocks
        for node in ast.walk(ast.parse(block))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "client"
    ]
    assert {call.func.attr for call in calls} >= {"context", "history", "search"}  # type: ignore[attr-defined]
    for call in calls:
        method = getattr(CompactorClient, call.func.attr)  # type: ignore[attr-defined]
        accepted = set(inspect.signature(method).parameters)
        assert {k.arg for k in call.keywords} <= accepted, call.func.attr  # type: ignore[attr-defined]
