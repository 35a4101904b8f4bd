"""docs/acceptance.md must stay true: every seed AC mapped, every named test real."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

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
