"""Waking the readers that wait for a conversation's newest messages to be stored.

A platform publishes a message, then asks for the context *through* it
(``GET /conversations/{id}/context?through=…&wait_ms=…``). The worker that
ingests the conversation's partition says here when a group's messages are
stored (committed), and a reader waiting on one of those conversations looks
again at once instead of on its next poll. A reader served by another worker
hears nothing from this one and polls (``streams.http.context``): the notice
only makes the common case, one worker or the owner answering, immediate.

Bounded: one future per waiting request, removed when it wakes or times out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection


class IngestNotices:
    def __init__(self) -> None:
        self._waiting: dict[str, set[asyncio.Future[None]]] = {}

    def stored(self, conversation_keys: Collection[str]) -> None:
        """Messages of these conversations were just stored: wake their readers."""
        for key in conversation_keys:
            for waiter in self._waiting.pop(key, ()):
                if not waiter.done():
                    waiter.set_result(None)

    async def wait(self, conversation_key: str, within: float) -> bool:
        """Until messages of ``conversation_key`` are stored or ``within`` seconds
        pass; whether they were."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = self._waiting.setdefault(conversation_key, set())
        waiting.add(waiter)
        try:
            await asyncio.wait_for(waiter, max(0.0, within))
        except TimeoutError:
            return False
        finally:
            waiting.discard(waiter)
            if not waiting:
                with contextlib.suppress(KeyError):
                    if not self._waiting[conversation_key]:
                        del self._waiting[conversation_key]
        return True

    @property
    def waiting(self) -> int:
        return sum(len(waiters) for waiters in self._waiting.values())
