"""The scoped read's start is one simple query with the tenant inlined: only a
tenant id (or ``*``, every tenant) can reach it, never a string that could end
the literal or add a statement."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.adapters.postgres.connection import enter_scope, tenant_setting
from core.domain.tenancy import is_tenant_id
from core.ports.storage import ReadScope

pytestmark = pytest.mark.unit


def test_the_start_sets_the_role_and_the_tenant_for_the_transaction_only() -> None:
    sql = enter_scope(ReadScope.of_tenant("acme"), "repeatable_read")
    assert sql == (
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; "
        "SELECT set_config('role', 'compactor_reader', true), "
        "set_config('compactor.tenant', 'acme', true)"
    )
    everything = enter_scope(ReadScope.everything(), "read_committed")
    assert everything.startswith("BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY;")
    assert everything.endswith("set_config('compactor.tenant', '*', true)")


@pytest.mark.parametrize(
    "tenant", ["acme'; DROP TABLE messages; --", "a'b", "a\\b", "*", "", "a b", "acme/x", "é"]
)
def test_what_is_not_a_tenant_id_never_reaches_the_query(tenant: str) -> None:
    with pytest.raises(ValueError):
        tenant_setting(ReadScope(tenant=tenant))
    with pytest.raises(ValueError):
        enter_scope(ReadScope(tenant=tenant), "read_committed")


@given(st.text(max_size=40))
def test_any_text_is_refused_or_is_a_tenant_id_without_a_quote(tenant: str) -> None:
    try:
        value = tenant_setting(ReadScope(tenant=tenant))
    except ValueError:
        return
    assert is_tenant_id(value) and "'" not in value and "\\" not in value
