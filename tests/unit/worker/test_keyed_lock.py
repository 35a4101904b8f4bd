"""One conversation at a time across the two accounting agents."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


async def test_the_keyed_lock_serialises_one_key_and_forgets_idle_keys() -> None:
    import asyncio

    from streams.worker.keyed_lock import KeyedLock

    locks = KeyedLock()
    order: list[str] = []
    release = asyncio.Event()

    async def hold(key: str, name: str) -> None:
        async with locks.hold(key):
            order.append(f"{name} in")
            if name == "first":
                await release.wait()
            order.append(f"{name} out")

    first = asyncio.create_task(hold("a", "first"))
    await asyncio.sleep(0)
    second = asyncio.create_task(hold("a", "second"))
    other = asyncio.create_task(hold("b", "other"))
    await other
    await asyncio.sleep(0)
    assert order == ["first in", "other in", "other out"]
    release.set()
    await asyncio.gather(first, second)
    assert order[3:] == ["first out", "second in", "second out"]
    assert len(locks) == 0
