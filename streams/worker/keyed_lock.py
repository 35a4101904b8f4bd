"""One asyncio lock per key, dropped when nobody holds or waits for it.

Messages and control events of one conversation are handled by two agents
(so completions never queue behind a message backlog); this keeps each
conversation's read-modify-write of its table entry single-file.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable, Iterable
from contextlib import asynccontextmanager


class KeyedLock:
    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        async with self.hold_many((key,)):
            yield

    @asynccontextmanager
    async def hold_many(self, keys: Iterable[Hashable]) -> AsyncIterator[None]:
        """Every key's lock, taken in one global order so two holders cannot deadlock.

        One context for the group, not one per key: a group of 500 events holds
        a few hundred keys, and a context manager each cost ~5 % of accounting."""
        joined: list[Hashable] = []
        acquired: list[asyncio.Lock] = []
        try:
            for key in sorted(set(keys), key=repr):
                lock = self._join(key)
                joined.append(key)
                await lock.acquire()
                acquired.append(lock)
            yield
        finally:
            for lock in reversed(acquired):
                lock.release()
            for key in joined:
                self._leave(key)

    def _join(self, key: Hashable) -> asyncio.Lock:
        """The key's lock, counted as used (holders and waiters) until ``_leave``."""
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        return lock

    def _leave(self, key: Hashable) -> None:
        lock, users = self._locks[key]
        if users == 1:
            del self._locks[key]
        else:
            self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)
