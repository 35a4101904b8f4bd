"""What ``bench.turn_read`` sends and times: paced background traffic, a platform's
turn (publish, then read), latency samples, and "every conversation compacted"."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Self

import aiohttp
from aiokafka import AIOKafkaProducer

from bench.harness import message_event, parse_metrics, percentile
from streams.events import MessageEvent

WINDOW = 8_000  # model_max_tokens
BUDGET = WINDOW // 2  # context_budget 0.5
TURN_BASE = 1_000_000  # indices of measured turns: after every prefilled one


def conversation_events(ids: list[str], turns: int) -> Iterator[MessageEvent]:
    """``turns`` turns of each conversation, interleaved as concurrent chats are."""
    for index in range(turns):
        for cid in ids:
            yield message_event(cid, index)


def last_id(cid: str, turns: int) -> str:
    return message_event(cid, turns - 1).message_id


class Latencies:
    """Samples in milliseconds."""

    def __init__(self) -> None:
        self.samples: list[float] = []

    @property
    def count(self) -> int:
        return len(self.samples)

    def add(self, seconds: float) -> None:
        self.samples.append(seconds * 1000)

    def p(self, q: float) -> float:
        return percentile(self.samples, q) if self.samples else float("nan")

    def summary(self) -> dict[str, Any]:
        return {
            "n": self.count,
            **{f"p{q}": round(self.p(q), 1) for q in (50, 95, 99)},
            "max": round(max(self.samples), 1) if self.samples else None,
        }


def _producer(bootstrap: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=2)


class InBackground:
    """Runs ``_run`` as a task while the ``async with`` block runs."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class LoopLag(InBackground):
    """How late this process's own event loop runs a 10 ms timer, while the ``async
    with`` block runs: a reader's latency includes it, so a figure taken while the
    bench's loop lags measures the bench too."""

    def __init__(self, every: float = 0.01) -> None:
        super().__init__()
        self.late = Latencies()
        self._every = every

    async def _run(self) -> None:
        while True:
            due = time.monotonic() + self._every
            await asyncio.sleep(self._every)
            self.late.add(max(time.monotonic() - due, 0.0))


FINISHED = (
    "compactor_compactions_succeeded_total",
    "compactor_compactions_failed_total",
    "compactor_compactions_noop_total",
)


def compaction_summary(
    first: dict[str, float], last: dict[str, float], limits: list[float], seconds: float
) -> dict[str, float]:
    """What the compactions did while the turns were measured (the pace's cost):
    committed per second, the mean limit, and how much the backlog of issued,
    not yet finished commands grew (> 0: they did not keep up)."""

    def grew(name: str) -> float:
        return last.get(name, 0.0) - first.get(name, 0.0)

    finished = sum(grew(name) for name in FINISHED)
    return {
        "per_s": round(grew("compactor_compactions_succeeded_total") / max(seconds, 1e-9), 1),
        "limit_mean": round(sum(limits) / len(limits), 1) if limits else 0.0,
        "backlog_grew": round(grew("compactor_commands_issued_total") - finished),
    }


class CompactionSide(InBackground):
    """Samples the workers' /metrics every ``every`` seconds while the ``async with``
    block runs (summed over the workers): ``summary`` is ``compaction_summary``."""

    def __init__(self, urls: list[str], every: float = 0.5) -> None:
        super().__init__()
        self._urls = urls
        self._every = every
        self._samples: list[dict[str, float]] = []

    async def _sample(self, http: aiohttp.ClientSession) -> None:
        total: dict[str, float] = {}
        for url in self._urls:
            async with http.get(f"{url}/metrics") as response:
                for name, value in parse_metrics(await response.text()).items():
                    total[name] = total.get(name, 0.0) + value
        self._samples.append(total)

    async def _run(self) -> None:
        async with aiohttp.ClientSession() as http:
            while True:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    await self._sample(http)
                await asyncio.sleep(self._every)

    def summary(self, seconds: float) -> dict[str, float]:
        if len(self._samples) < 2:
            return {}
        limits = [s.get("compactor_compaction_limit", 0.0) for s in self._samples]
        return compaction_summary(self._samples[0], self._samples[-1], limits, seconds)


def background_events(conversations: int, mix: str) -> Iterator[MessageEvent]:
    """The background's events, for ever (``Traffic``'s ``mix``)."""
    if mix == "round-robin":
        for n in itertools.count():
            yield message_event(f"noise-{n % conversations:03d}", n // conversations, words=30)
    draw = random.Random(11)
    weights = [draw.uniform(0.25, 1.75) for _ in range(conversations)]
    sent = [0] * conversations
    while True:
        for k in draw.choices(range(conversations), weights, k=1000):
            yield message_event(f"noise-{k:03d}", sent[k], words=30)
            sent[k] += 1


class Traffic:
    """``rate`` events/s into 200 other conversations, paced every 10 ms, for as
    long as the ``async with`` block runs.

    ``mix="round-robin"``: each conversation in turn, so all reach their budget
    together and their compactions come as one wave (the worst case);
    ``"varied"``: each event to a conversation drawn by a fixed weight (0.25 to
    1.75, seeded), as chats that move at different speeds: they cross their
    budgets at different times."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        rate: float,
        conversations: int = 200,
        mix: str = "round-robin",
    ) -> None:
        self.conversations = conversations
        self._mix = mix
        self._producer = _producer(bootstrap)
        self._topic, self._rate = topic, rate
        self._sent, self._started = 0, 0.0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Traffic:
        await self._producer.start()
        self._started = time.monotonic()
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._producer.stop()

    def achieved(self) -> float:
        return self._sent / max(time.monotonic() - self._started, 1e-9)

    async def _run(self) -> None:
        events = background_events(self.conversations, self._mix)
        while True:
            due = int(self._rate * (time.monotonic() - self._started)) - self._sent
            acks = []
            for event in itertools.islice(events, max(due, 0)):
                acks.append(await self._send(event))
                self._sent += 1
            await asyncio.gather(*acks)
            await asyncio.sleep(0.01)

    async def _send(self, event: MessageEvent) -> Any:
        key = event.conversation_id.encode()
        return await self._producer.send(self._topic, event.model_dump_json().encode(), key=key)


class Turns:
    """A platform's turn: publish a message (acks=all), then read the context."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._producer = _producer(bootstrap)
        self._topic = topic
        self._next: dict[str, int] = {}

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def publish(self, cid: str) -> str:
        """The position of the stored turn, as the producer's ack returned it."""
        index = self._next.get(cid, TURN_BASE)
        self._next[cid] = index + 1
        event = message_event(cid, index)
        value = event.model_dump_json().encode()
        ack = await self._producer.send_and_wait(self._topic, value, key=cid.encode())
        return f"{ack.partition}:{ack.offset}"

    async def publish_and_wait(self, http: aiohttp.ClientSession, cid: str) -> int:
        return await self.wait_for(http, cid, await self.publish(cid))

    async def wait_for(self, http: aiohttp.ClientSession, cid: str, after: str) -> int:
        """The context once it includes the record at ``after`` (5 s at most)."""
        params = {"format": "messages", "after": after, "wait_ms": "5000"}
        async with http.get(f"/conversations/{cid}/context", params=params) as response:
            await response.read()
            return response.status

    async def timed_get(
        self,
        http: aiohttp.ClientSession,
        cid: str,
        params: dict[str, str],
        into: Latencies,
        path: str = "context",
    ) -> int:
        started = time.monotonic()
        async with http.get(f"/conversations/{cid}/{path}", params=params) as response:
            await response.read()
        if response.status == 200:
            into.add(time.monotonic() - started)
        return response.status

    async def one(
        self,
        http: aiohttp.ClientSession,
        cid: str,
        latencies: dict[str, Latencies],
        statuses: dict[int, int],
    ) -> None:
        """One turn: publish, wait for it (publish-to-readable), a cold and a cached
        read of the OpenAI shape, and the whole /history as the baseline."""
        started = time.monotonic()
        after = await self.publish(cid)
        acked = time.monotonic()
        codes = [await self.wait_for(http, cid, after)]
        if codes[0] in (200, 409):  # a 409 (not stored within the wait) counts as its wait:
            latencies["publish_to_readable"].add(time.monotonic() - started)  # a lower bound
            latencies["ack"].add(acked - started)
        shape = {"format": "openai"}
        codes.append(await self.timed_get(http, cid, shape, latencies["cold"]))
        codes.append(await self.timed_get(http, cid, shape, latencies["cached"]))
        page = {"limit": "1000"}
        codes.append(await self.timed_get(http, cid, page, latencies["history"], "history"))
        for code in codes:
            statuses[code] = statuses.get(code, 0) + 1


async def _is_settled(http: aiohttp.ClientSession, cid: str, through: str) -> bool:
    """Every turn sent is stored, nothing is in flight, and it is at or under the
    budget without a provisional fit."""
    params = {"format": "messages", "fit": "none", "through": through, "wait_ms": "0"}
    async with http.get(f"/conversations/{cid}/context", params=params) as response:
        if response.status != 200:
            return False
        body = await response.json()
    return body["stored_tokens"] <= BUDGET and body["pending_compaction"] is None


async def settled(
    http: aiohttp.ClientSession, ids: list[str], turns: int, wait: float = 0.0
) -> bool:
    """Whether (with ``wait``: until, or TimeoutError) every conversation is settled."""
    deadline = time.monotonic() + wait
    while True:
        states = [await _is_settled(http, cid, last_id(cid, turns)) for cid in ids]
        if all(states) or wait <= 0:
            return all(states)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{states.count(False)} of {len(ids)} not compacted in {wait}s")
        await asyncio.sleep(0.5)
