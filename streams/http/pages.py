"""Pages of the history and batch views: ``limit`` and an opaque ``cursor``.

A page holds at most ``limit`` messages (``[service].page_default_limit`` when
absent, ``[service].page_max_limit`` at most); its body's ``next_cursor`` is
the cursor of the next page, or null after the last. A cursor is the last
message's place in the read's order (``core.ports.storage.MessageKey``),
base64url-encoded; the store reads the next page by keyset (strictly after
it), so pages neither skip nor repeat a message while the history grows.
A cursor names no conversation: the view's own access check applies to every
page, and a cursor from another conversation only picks a starting point.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from datetime import datetime

from core.domain.messages import ConversationMessage
from core.ports.storage import MessageKey
from core.settings import ServiceSettings

MAX_CURSOR_CHARS = 1024


def cursor_of(message: ConversationMessage) -> str:
    key = MessageKey.of(message)
    raw = json.dumps([int(key.clip_archive), key.created_at.isoformat(), key.id])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def key_of(cursor: str) -> MessageKey:
    """The place a cursor names; ValueError for anything that is not one of ours."""
    if not cursor or len(cursor) > MAX_CURSOR_CHARS:
        raise ValueError("cursor is not valid")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        clip, created, message_id = json.loads(raw)
        when = datetime.fromisoformat(created)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise ValueError("cursor is not valid") from None
    if clip not in (0, 1) or not isinstance(message_id, str) or when.utcoffset() is None:
        raise ValueError("cursor is not valid")
    return MessageKey(when, message_id, bool(clip))


def page_request(
    query: Mapping[str, str], service: ServiceSettings
) -> tuple[int, MessageKey | None]:
    """``limit`` and where to start; ValueError (400) says what is wrong."""
    most = service.page_max_limit
    raw = query.get("limit")
    if raw is None:
        limit = min(service.page_default_limit, most)
    elif len(raw) > 6 or not raw.isdigit() or not 1 <= int(raw) <= most:
        raise ValueError(f"limit must be a whole number from 1 to {most}")
    else:
        limit = int(raw)
    cursor = query.get("cursor")
    return limit, None if cursor is None else key_of(cursor)
