"""One guard between every compaction of a worker and its LLM provider.

Why: retries and the circuit breaker used to be per conversation only, so
during a provider outage the calls into the failing provider grew with the
number of conversations waiting to be compacted. The guard is shared by every
compaction in the process (the compactor holds it, and there is one compactor
per runtime), so what reaches the provider is bounded by the guard's limits
alone:

* at most ``max_concurrent`` calls are in flight at once, and the slots are
  shared by tenant (``core.fair_slots``: round robin, optional weights), so
  one tenant's burst does not starve the others;
* a 429's ``retry-after`` pauses every call, not just the one that got it: no
  call starts before it ends. A call that would start during a pause waits it
  out when the wait is short (``max_wait_seconds``), else it is refused;
* ``failure_threshold`` provider failures in a row (429, 5xx or overloaded,
  broken connection or body, timeout, rejected key), from whichever conversations,
  open the breaker for a cool-down that doubles each time it opens again, up
  to ``max_cooldown_seconds``. Calls are refused while it is open; after the
  cool-down one probe call goes through (half-open): an answer closes the
  breaker, another failure re-opens it.

A refused call raises ``ProviderUnavailableError`` at once, so the compaction
fails fast with its history untouched. Its command then waits in
``until_answering`` and goes again as soon as the guard admits calls (its
half-open probe answered), paced by the same limits; reconciliation is the
net only for a command that waited past its timeout.
An answer that rejects the request itself (a 400, a reply with no text) says
the provider is up, and neither counts as a failure nor resets the count. A 200
whose body is no response at all (broken JSON, a proxy's HTML page:
``ModelUnreadableError``) is a server error: the path to the provider is down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

from core.fair_slots import FairSlots
from core.ports.model import (
    ModelAuthError,
    ModelError,
    ModelRateLimitError,
    ModelServerError,
    ModelTimeoutError,
)

log = logging.getLogger("compactor.provider")

T = TypeVar("T")

GuardState = Literal["closed", "paused", "open", "half_open"]
GUARD_STATES: tuple[GuardState, ...] = ("closed", "paused", "open", "half_open")
CallOutcome = Literal["success", "rate_limited", "server_error", "timeout", "auth", "rejected"]


class ProviderUnavailableError(ModelError):
    """The guard refused the call: the provider is paused or its breaker is open.

    Not retryable: trying again within the same compaction could only wait or
    be refused again, so the compaction fails now and is retried later.
    """

    retryable = False

    def __init__(self, state: GuardState, retry_in: float, *, provider: str | None = None) -> None:
        detail = "probe in flight" if state == "half_open" else f"retry in {retry_in:.0f}s"
        super().__init__(f"LLM provider {state.replace('_', '-')}: {detail}", provider=provider)
        self.state = state
        self.retry_in = retry_in


def provider_failure(error: BaseException) -> CallOutcome | None:
    """What kind of provider failure ``error`` is; ``None`` when the provider
    answered and only this request was refused (400, malformed body)."""
    if isinstance(error, ModelRateLimitError):
        return "rate_limited"
    if isinstance(error, ModelServerError):
        return "server_error"
    if isinstance(error, ModelTimeoutError):
        return "timeout"
    if isinstance(error, ModelAuthError):
        return "auth"
    return None


class GuardObserver(Protocol):
    """Events a gauge cannot read at scrape time (see ``ProviderGuard.state``
    and ``in_flight`` for those). Called synchronously; must not block."""

    def on_call(self, outcome: CallOutcome) -> None: ...

    def on_refused(self, state: GuardState) -> None: ...


@dataclass(frozen=True)
class GuardLimits:
    """The guard's settings; their defaults live in ``[summarization]``
    (``core.compaction.factory.guard_limits`` maps them)."""

    max_concurrent: int
    failure_threshold: int
    cooldown_seconds: float
    max_cooldown_seconds: float
    max_wait_seconds: float
    fair_share: bool = True  # slots by tenant (round robin); False: one FIFO queue
    tenant_weights: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_concurrent < 1 or self.failure_threshold < 1:
            raise ValueError("max_concurrent and failure_threshold must be >= 1")


class ProviderGuard:
    """See the module docstring. ``clock`` and ``sleep`` are injectable so the
    tests can drive time; they must agree (a sleep advances the clock)."""

    def __init__(
        self,
        limits: GuardLimits,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        observer: GuardObserver | None = None,
    ) -> None:
        self.limits = limits
        self.observer = observer
        self._clock = clock
        self._sleep = sleep
        # A quarter of the slots stays free for another tenant active in the last 10 s
        # (FairSlots, headroom): a burst cannot make it wait a whole call.
        self._slots = FairSlots(
            limits.max_concurrent,
            weights=limits.tenant_weights,
            fair=limits.fair_share,
            headroom=limits.max_concurrent // 4,
            active_seconds=10.0,
            clock=clock,
        )
        self._failures = 0  # provider failures in a row
        self._opened = 0  # times opened since it last closed: the back-off exponent
        self._tripped = False
        self._blocked_until = 0.0  # no call starts before this
        self._probe_in_flight = False
        self.in_flight = 0
        self.waiting = 0
        self.successes = 0  # answers so far; lets a caller tell whether others got through
        # Resolved at the next answer, opening or verdict (``until_answering`` waits on it).
        self._changed: asyncio.Future[None] | None = None

    def state(self) -> GuardState:
        blocked = self._clock() < self._blocked_until
        if self._tripped:
            return "open" if blocked else "half_open"
        return "paused" if blocked else "closed"

    def retry_in(self) -> float:
        return max(0.0, self._blocked_until - self._clock())

    async def until_answering(self, since: int) -> None:
        """Return once the provider has answered anyone since the guard's answer
        count was ``since`` (``successes``), or a call of the caller's would be
        the half-open probe, or a pause it waited out is over.

        For compactions refused or failed in an outage: they wait here instead
        of for their command's timeout, so they go again the moment the
        provider is back, paced by the guard's cap. Nothing here calls the
        provider: with the guard closed and no answer yet (failures below the
        threshold), the wait is for the next answer or the breaker opening; while
        a probe is out, for its verdict. The caller bounds the wait.
        """
        while True:
            if self.answering_since(since):
                return
            state = self.state()
            if state in ("open", "paused"):  # a late answer while open changes nothing
                await self._waiting(self._sleep(max(self.retry_in(), 0.001)))
                if self.state() == "closed":
                    return  # a pause (retry-after) is over: calls go again
                continue
            await self._waiting(asyncio.shield(self._next_change()))

    def answering_since(self, since: int) -> bool:
        """Would a call go now, the provider having answered anyone since its
        answer count was ``since``, or as the half-open probe? What
        ``until_answering`` waits for, asked without waiting."""
        state = self.state()
        if state == "half_open":
            return not self._probe_in_flight
        return state == "closed" and self.successes > since

    def in_outage(self) -> bool:
        """Is the provider failing for everyone now: the breaker tripped (open or
        half-open) or a ``retry-after`` pause on? A failure then may be the
        outage's even when it cannot be told apart from the request's own."""
        return self._tripped or self.state() == "paused"

    def _next_change(self) -> asyncio.Future[None]:
        if self._changed is None or self._changed.done():
            self._changed = asyncio.get_running_loop().create_future()
        return self._changed

    def _notify(self) -> None:
        """An answer, the breaker opening, a probe's verdict: wake ``until_answering``."""
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    async def call(self, operation: Callable[[], Awaitable[T]], tenant: str | None = None) -> T:
        """Run ``operation`` (one LLM call) under the guard's limits, in ``tenant``'s
        turn for a slot.

        Raises ``ProviderUnavailableError`` without calling when refused. The
        call's own timeout belongs inside ``operation``: time spent waiting
        for a slot must not count as the provider being slow.
        """
        probe = await self._admit(tenant)
        try:
            result = await operation()
        except ModelError as error:
            self._record_failure(error, probe)
            raise
        except BaseException:
            if probe:
                self._probe_in_flight = False  # cancelled: no verdict, another may probe
                self._notify()
            raise
        else:
            self._record_success(probe)
            return result
        finally:
            self.in_flight -= 1
            self._slots.release(tenant)

    async def _admit(self, tenant: str | None) -> bool:
        """Wait for a slot and any short pause; ``True`` when this call is the probe."""
        waited = 0.0
        while True:
            wait = self._gate(waited)
            if wait > 0:
                waited += wait
                await self._waiting(self._sleep(wait))
                continue
            await self._waiting(self._slots.acquire(tenant))
            try:
                wait = self._gate(waited)  # things may have changed while queued
            except ProviderUnavailableError:
                self._slots.release(tenant)
                raise
            if wait > 0:
                self._slots.release(tenant)
                continue
            probe = self._tripped  # admitted while tripped: only as the half-open probe
            if probe:
                self._probe_in_flight = True
            self.in_flight += 1
            return probe

    async def _waiting(self, pending: Awaitable[object]) -> None:
        self.waiting += 1
        try:
            await pending
        finally:
            self.waiting -= 1

    def _gate(self, waited: float) -> float:
        """0 to go now, else seconds to wait first; raises when refused.

        ``waited`` is what this call has waited already: the pauses a call
        sits out add up to at most ``max_wait_seconds``.
        """
        state = self.state()
        if state == "closed" or (state == "half_open" and not self._probe_in_flight):
            return 0.0
        remaining = self.retry_in()
        if state == "paused" and waited + remaining <= self.limits.max_wait_seconds:
            return remaining
        if self.observer is not None:
            self.observer.on_refused(state)
        raise ProviderUnavailableError(state, remaining)

    def _record_success(self, probe: bool) -> None:
        self.successes += 1
        self._failures = 0
        if probe:
            self._probe_in_flight = False
            self._tripped = False
            self._opened = 0
            log.info("LLM provider answers again: calls resume")
        self._observe("success")
        self._notify()

    def _record_failure(self, error: ModelError, probe: bool) -> None:
        kind = provider_failure(error)
        if kind is None:
            if probe:
                self._probe_in_flight = False
                self._notify()
            self._observe("rejected")
            return
        self._observe(kind)
        now = self._clock()
        self._failures += 1
        if isinstance(error, ModelRateLimitError) and error.retry_after is not None:
            self._blocked_until = max(self._blocked_until, now + error.retry_after)
        if probe or (not self._tripped and self._failures >= self.limits.failure_threshold):
            self._open(now, error)
        if probe:
            self._probe_in_flight = False
        self._notify()  # after re-opening: the waiters see the new cool-down

    def _open(self, now: float, error: ModelError) -> None:
        limits = self.limits
        cooldown = min(limits.max_cooldown_seconds, limits.cooldown_seconds * 2**self._opened)
        self._opened += 1
        self._tripped = True
        self._blocked_until = max(self._blocked_until, now + cooldown)
        log.warning(
            "LLM provider failing (%d in a row, last %s: %s): no calls for %.1fs, then one probe",
            self._failures,
            type(error).__name__,
            error,
            self._blocked_until - now,
        )

    def _observe(self, outcome: CallOutcome) -> None:
        if self.observer is not None:
            self.observer.on_call(outcome)
