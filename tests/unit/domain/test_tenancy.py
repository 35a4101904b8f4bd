"""Conversation keys: (tenant, id) as one string, one-to-one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.domain.tenancy import ConversationRef, conversation_key, is_tenant_id

pytestmark = pytest.mark.unit

tenants = st.one_of(st.none(), st.from_regex(r"\A[A-Za-z0-9._:@-]{1,20}\Z"))
# Any id a producer may send, slashes and tenant look-alikes included.
ids = st.one_of(
    st.text(min_size=1, max_size=30),
    st.builds(lambda a, b: f"{a}/{b}", st.text(max_size=8), st.text(max_size=8)),
    st.builds(lambda a: f"/{a}", st.text(max_size=8)),
)


@given(tenants, ids)
def test_a_key_gives_back_its_tenant_and_id(tenant: str | None, conversation: str) -> None:
    key = conversation_key(tenant, conversation)
    assert ConversationRef.of_key(key) == ConversationRef(tenant, conversation)
    assert ConversationRef(tenant, conversation).key == key


@given(tenants, ids, tenants, ids)
def test_two_conversations_never_share_a_key(
    tenant_a: str | None, id_a: str, tenant_b: str | None, id_b: str
) -> None:
    if (tenant_a, id_a) != (tenant_b, id_b):
        assert conversation_key(tenant_a, id_a) != conversation_key(tenant_b, id_b)


def test_the_shapes_of_a_key() -> None:
    assert conversation_key("acme", "support-1") == "acme/support-1"
    assert conversation_key(None, "support-1") == "support-1"  # as before tenants
    assert conversation_key(None, "acme/support-1") == "/acme/support-1"  # never acme's
    assert conversation_key("acme", "a/b") == "acme/a/b"


def test_a_tenant_id_never_holds_the_separator() -> None:
    for bad in ("a/b", "", "*", "x" * 257, "é"):
        assert not is_tenant_id(bad)
        with pytest.raises(ValueError):
            conversation_key(bad, "c")
    with pytest.raises(ValueError):
        conversation_key("acme", "")
