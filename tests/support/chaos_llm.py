"""The LLM wire test server with jittered latency and a time-boxed error storm.

``LLMTestServer`` scripts failures one request at a time; fault-injection
runs need failures by the clock instead ("every request fails in some way for
60 s, then everything is healthy"), and replies slow enough, with jitter, that
a killed worker dies in the middle of a compaction. Both are layered on the
server's own action machinery, so the wire shapes (429 bodies, retry-after,
broken JSON, slow replies) are exactly those the adapter tests pin.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Sequence

from tests.support.llm_server import (
    EMBEDDINGS_PATH,
    Action,
    Delay,
    LLMTestServer,
    Malformed,
    RateLimited,
    Reply,
    Responder,
    ServerError,
    summary_responder,
)


def storm_actions(timeout_seconds: float) -> tuple[Action, ...]:
    """Every kind of provider failure: 429 with and without retry-after, 500,
    503, 529, a reply slower than the client's timeout, and broken bodies."""
    return (
        RateLimited(retry_after=1.0),
        RateLimited(retry_after=None),
        ServerError(500),
        ServerError(503),
        Delay(timeout_seconds * 2 + 0.5),
        Malformed(),
        Malformed(body="<html><body>502 Bad Gateway</body></html>", content_type="text/html"),
        Malformed(body="{}"),
    )


class TimedStorm:
    """A default action for the LLM test server: every chat request fails with one
    of ``actions`` (chosen by a seeded generator) for ``seconds`` from the first
    one, then all answer; embeddings always answer. ``served`` counts the failures
    by kind."""

    def __init__(self, seconds: float, actions: Sequence[Action], seed: int) -> None:
        self.seconds = seconds
        self.started: float | None = None
        self._actions = tuple(actions)
        self._rng = random.Random(seed)
        self.served: Counter[str] = Counter()

    @property
    def until(self) -> float:
        assert self.started is not None, "no LLM request yet"
        return self.started + self.seconds

    def __call__(self, path: str) -> Action:
        if path == EMBEDDINGS_PATH:
            return Reply()
        now = time.monotonic()
        if self.started is None:
            self.started = now
        if now >= self.until:
            return Reply()
        action = self._rng.choice(self._actions)
        self.served[type(action).__name__] += 1
        return action


def _kind(action: Action) -> str:
    if isinstance(action, RateLimited):
        return "429" if action.retry_after is None else "429+retry-after"
    if isinstance(action, ServerError):
        return str(action.status)
    if isinstance(action, Delay):
        return "slow"
    if isinstance(action, Malformed):
        return f"malformed:{action.content_type}:{action.body[:8]}"
    return type(action).__name__


class ChaosLLMServer(LLMTestServer):
    """``latency`` is a (low, high) range in seconds drawn per request."""

    def __init__(
        self,
        *,
        latency: tuple[float, float] = (0.0, 0.0),
        responder: Responder = summary_responder,
        seed: int = 0,
    ) -> None:
        super().__init__(responder=responder)
        self.latency = latency
        self._rng = random.Random(seed)
        self._storm: Sequence[Action] = ()
        self._storm_until = 0.0
        self.in_flight = 0
        self.served: Counter[str] = Counter()

    def start_storm(self, actions: Sequence[Action], seconds: float) -> None:
        """Until ``seconds`` from now, every chat request gets a random one of ``actions``."""
        self._storm = tuple(actions)
        self._storm_until = time.monotonic() + seconds

    def end_storm(self) -> None:
        self._storm_until = 0.0

    @property
    def storming(self) -> bool:
        return time.monotonic() < self._storm_until

    def _next_action(self, path: str) -> Action:
        scripted = super()._next_action(path)
        if isinstance(scripted, Reply) and self.storming and path != "/v1/embeddings":
            scripted = self._rng.choice(self._storm)
        self.served[_kind(scripted)] += 1
        return scripted

    async def _settle(self, path: str) -> Action:
        self.in_flight += 1
        try:
            low, high = self.latency
            if high > 0:
                await asyncio.sleep(self._rng.uniform(low, high))
            return await super()._settle(path)
        finally:
            self.in_flight -= 1
