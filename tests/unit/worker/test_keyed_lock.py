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


async def test_a_group_waits_for_its_held_keys_and_a_cancelled_wait_leaves_nothing() -> None:
    import asyncio

    from streams.worker.keyed_lock import KeyedLock

    locks = KeyedLock()
    entered = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with locks.hold("b"):
            entered.set()
            await release.wait()

    first = asyncio.create_task(holder())
    await entered.wait()
    group_in = asyncio.Event()

    async def group() -> None:
        async with locks.hold_many(["c", "a", "b", "a"]):
            group_in.set()

    waiting = asyncio.create_task(group())
    await asyncio.sleep(0)
    assert not group_in.is_set() and len(locks) == 2  # a taken, waits on b (c comes after)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert len(locks) == 1  # only the holder's b
    again = asyncio.create_task(group())
    await asyncio.sleep(0)
    assert not group_in.is_set()
    release.set()
    await asyncio.gather(first, again)
    assert group_in.is_set() and len(locks) == 0
