"""memory_read's statements: each scope filters only on what it names, and the
tsquery of the selective terms quotes each lexeme."""

from __future__ import annotations

import pytest

from core.adapters.postgres.memory_statements import Scope, _where, tsquery_any

pytestmark = pytest.mark.unit


def test_selective_terms_are_quoted_into_an_or_query() -> None:
    assert tsquery_any(["dentist", "o'brien"]) == "'dentist' | 'o''brien'"


def test_each_scope_filters_only_on_what_it_names() -> None:
    assert _where(Scope(None, None).kind, "a", 3) == "true"
    assert _where(Scope("c", None).kind, "a", 3) == "a.conversation_id = $3"
    both = _where(Scope("c", "t").kind, "a", 3)
    assert both.startswith("a.conversation_id = $3 AND a.conversation_id IN (")
    assert "tenant_id = $4" in both
    assert Scope("c", "t").params == ["c", "t"]
    assert "tenant_id = $3" in _where(Scope(None, "t").kind, "a", 3)
