"""Producer signatures: a tenant's message events signed with the tenant's key.

A conversation's identity includes its tenant (``core.domain.tenancy``), so a
producer cannot squat or write into another tenant's conversation by choosing
an id, but it can still name another tenant in ``tenant_id``. Where several
producing services share the messages topic, each tenant gets secret keys
(``[tenancy].signing_keys``) and signs its records: the header
``compactor-signature: v1=<hex HMAC-SHA256 of the record value>``, made with
any of the tenant's keys (several during a rotation). The value alone is
signed: it holds ``tenant_id`` and ``conversation_id``, and the record key
must equal the value's ``conversation_id`` (checked apart), so a signature
cannot be moved to another tenant, conversation or content.

HMAC rather than a public-key signature: the worker must hold the secret
either way to verify it, producers sign thousands of events a second, and
the standard library has it (``hmac``, constant-time comparison).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

SIGNATURE_HEADER = "compactor-signature"
_VERSION = "v1="


def signature(key: bytes, value: bytes) -> str:
    """The header value that signs ``value`` with ``key``."""
    return _VERSION + hmac.new(key, value, hashlib.sha256).hexdigest()


def verified(keys: Iterable[bytes], value: bytes, header: bytes | None) -> bool:
    """Whether ``header`` is a valid signature of ``value`` by one of ``keys``.
    Every key is tried, whichever matches, so the time taken says nothing."""
    if header is None:
        return False
    try:
        given = header.decode("ascii")
    except UnicodeDecodeError:
        return False
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(given, signature(key, value))
    return matched
