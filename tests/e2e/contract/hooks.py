"""schemathesis hooks for tests/e2e/test_api_contract.py (SCHEMATHESIS_HOOKS).

One check of our own besides schemathesis' built-in ones: a 400 says which
parameter is wrong, by name (the views' ``error`` text), so a client learns
what to fix from the answer alone.
"""

from __future__ import annotations

from typing import Any

import schemathesis


def _declared(case: Any) -> set[str]:
    names = set()
    for parameter in case.operation.definition.raw.get("parameters", ()):
        names.add(parameter["name"])
    return names


@schemathesis.check
def bad_input_names_the_parameter(ctx: Any, response: Any, case: Any) -> bool | None:
    if response.status_code != 400:
        return None
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"a 400 without an error text: {response.text[:200]!r}") from None
    named = [name for name in _declared(case) if name in error]
    if not named:
        raise AssertionError(f"a 400 whose error names no parameter: {error!r}")
    return True
