"""Limits the team holds the code to, checked so they stay true.

Why: the worker used to be one 552-line closure nothing could test; these
keep functions short enough to read, modules small enough to hold one job,
and the app module an assembly of named components rather than their
implementation.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
MAX_FUNCTION_LINES = 45
MAX_MODULE_LINES = 400
MAX_APP_MODULE_LINES = 200


def functions(package: str) -> list[tuple[str, int]]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                found.append((f"{path.relative_to(ROOT)}:{node.lineno} {node.name}", length))
    return found


@pytest.mark.parametrize("package", ["core", "streams", "devtools"])
def test_no_function_is_longer_than_45_lines(package: str) -> None:
    too_long = [(where, n) for where, n in functions(package) if n > MAX_FUNCTION_LINES]
    assert not too_long, f"split these (limit {MAX_FUNCTION_LINES} lines): {too_long}"


@pytest.mark.parametrize("package", ["core", "streams", "devtools"])
def test_no_module_is_over_400_lines(package: str) -> None:
    too_long = [
        (str(path.relative_to(ROOT)), lines)
        for path in sorted((ROOT / package).rglob("*.py"))
        if (lines := path.read_text(encoding="utf-8").count("\n")) > MAX_MODULE_LINES
    ]
    assert not too_long, f"split these by job (limit {MAX_MODULE_LINES} lines): {too_long}"


def test_the_app_module_only_assembles() -> None:
    lines = (ROOT / "streams" / "app.py").read_text(encoding="utf-8").count("\n")
    assert lines < MAX_APP_MODULE_LINES
