"""One asyncio lock per key, dropped when nobody holds or waits for it.

Messages and control events of one conversation are handled by two agents
(so completions never queue behind a message backlog); this keeps each
conversation's read-modify-write of its table entry single-file.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager


class KeyedLock:
    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    @asynccontextmanager
    async def hold_many(self, keys: Iterable[Hashable]) -> AsyncIterator[None]:
        """Every key's lock, taken in one global order so two holders cannot deadlock."""
        async with AsyncExitStack() as stack:
            for key in sorted(set(keys), key=repr):
                await stack.enter_async_context(self.hold(key))
            yield

    def __len__(self) -> int:
        return len(self._locks)
