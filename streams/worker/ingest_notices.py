"""Waking the readers that wait for a conversation's newest messages to be stored.

A platform publishes a message, then asks for the context *through* it
(``GET /conversations/{id}/context?through=…&wait_ms=…``). The worker that
ingests the conversation's partition says here when a group's messages are
stored (committed), and a reader waiting on one of those conversations looks
again at once instead of on its next poll.

A reader also learns here whether to expect a notice at all (``mark``): a
conversation this worker stored lately is ingested here, so its reader waits
for the notice and polls the store only rarely, as a safety net (a rebalance
may have moved the partition); any other conversation is ingested elsewhere
(or not yet) and its reader polls (``streams.worker.turn_context``). The mark
taken before the reader's look at the store also closes the race between that
look and its wait: a store in between is seen, not slept through.

Bounded: one future per waiting request, removed when it wakes or times out;
the marks of the conversations stored within the last one or two
``recent_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import Callable, Collection

RECENT_SECONDS = 30.0


class _Unseen(enum.Enum):
    """``wait`` without a mark: nothing to compare."""

    UNSEEN = enum.auto()


class IngestNotices:
    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, recent_seconds: float = RECENT_SECONDS
    ) -> None:
        self._waiting: dict[str, set[asyncio.Future[None]]] = {}
        self._clock, self._recent_seconds = clock, recent_seconds
        self._stores = 0
        # Generations of marks (the store number that last held each conversation):
        # a mark lives ``recent_seconds`` to twice that, at one dict write per key.
        self._recent: dict[str, int] = {}
        self._older: dict[str, int] = {}
        self._rotated = clock()

    def stored(self, conversation_keys: Collection[str]) -> None:
        """Messages of these conversations were just stored: wake their readers."""
        self._stores += 1
        now = self._clock()
        if now - self._rotated >= self._recent_seconds:
            self._older, self._recent, self._rotated = self._recent, {}, now
        number, recent = self._stores, self._recent
        for key in conversation_keys:
            recent[key] = number
            for waiter in self._waiting.pop(key, ()):
                if not waiter.done():
                    waiter.set_result(None)

    def mark(self, conversation_key: str) -> int | None:
        """Which store last held messages of ``conversation_key`` here; None when
        none did lately (it is ingested by another worker, or new)."""
        number = self._recent.get(conversation_key)
        return self._older.get(conversation_key) if number is None else number

    async def wait(
        self, conversation_key: str, within: float, *, seen: int | _Unseen | None = _Unseen.UNSEEN
    ) -> bool:
        """Until messages of ``conversation_key`` are stored or ``within`` seconds
        pass; whether they were. ``seen``: the ``mark`` the caller took before it
        last looked at the store; a store since then returns at once."""
        if seen is not _Unseen.UNSEEN and self.mark(conversation_key) != seen:
            return True
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
