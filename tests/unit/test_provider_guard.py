"""The provider guard on a fake clock: pauses, the concurrency cap, the breaker.

Why: the guard is what stands between thousands of conversations and a
failing provider; its rules (nobody calls before retry-after, never more
than N in flight, open / half-open / closed) must hold exactly, and time is
simulated so none of this sleeps.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest

from core.ports.model import (
    ModelAuthError,
    ModelError,
    ModelRateLimitError,
    ModelResponseError,
    ModelServerError,
    ModelTimeoutError,
    ModelUnreadableError,
)
from core.provider_guard import (
    CallOutcome,
    GuardLimits,
    GuardState,
    ProviderGuard,
    ProviderUnavailableError,
)
from streams.metrics import Metrics
from tests.support.metrics_text import label_values, metric

pytestmark = pytest.mark.unit


class FakeTime:
    """A clock that only moves when the guard sleeps (or a test says so)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


class Observed:
    def __init__(self) -> None:
        self.calls: Counter[CallOutcome] = Counter()
        self.refused: Counter[GuardState] = Counter()

    def on_call(self, outcome: CallOutcome) -> None:
        self.calls[outcome] += 1

    def on_refused(self, state: GuardState) -> None:
        self.refused[state] += 1


def make(**limits: float) -> tuple[ProviderGuard, FakeTime, Observed]:
    time = FakeTime()
    observed = Observed()
    settings: dict[str, float] = {
        "max_concurrent": 4,
        "failure_threshold": 3,
        "cooldown_seconds": 5,
        "max_cooldown_seconds": 15,
        "max_wait_seconds": 10,
    }
    settings.update(limits)
    guard = ProviderGuard(
        GuardLimits(**settings),  # type: ignore[arg-type]
        clock=time.clock,
        sleep=time.sleep,
        observer=observed,
    )
    return guard, time, observed


def answer(time: FakeTime, started: list[float] | None = None) -> Callable[[], Awaitable[str]]:
    async def operation() -> str:
        if started is not None:
            started.append(time.now)
        return "ok"

    return operation


def fail(error: ModelError) -> Callable[[], Awaitable[str]]:
    async def operation() -> str:
        raise error

    return operation


async def failing(guard: ProviderGuard, error: ModelError) -> None:
    with pytest.raises(type(error)):
        await guard.call(fail(error))


async def test_retry_after_pauses_every_call_until_it_ends() -> None:
    guard, time, observed = make()
    await failing(guard, ModelRateLimitError("429", retry_after=3.0))
    assert guard.state() == "paused"
    started: list[float] = []
    # Another conversation's call, an instant later: it starts at t=3, not before.
    assert await guard.call(answer(time, started)) == "ok"
    assert started == [3.0]
    assert time.slept == [3.0]
    assert guard.state() == "closed"
    assert observed.calls == {"rate_limited": 1, "success": 1}


async def test_a_pause_longer_than_max_wait_refuses_at_once() -> None:
    guard, time, observed = make(max_wait_seconds=10)
    await failing(guard, ModelRateLimitError("429", retry_after=60.0))
    started: list[float] = []
    with pytest.raises(ProviderUnavailableError) as refused:
        await guard.call(answer(time, started))
    assert (refused.value.state, refused.value.retry_in) == ("paused", 60.0)
    assert not refused.value.retryable
    assert str(refused.value) == "LLM provider paused: retry in 60s"
    assert started == [] and time.slept == []
    assert observed.refused == {"paused": 1}
    time.now = 60.0
    assert await guard.call(answer(time)) == "ok"


async def test_a_call_queued_for_a_slot_still_honours_a_pause_that_began_meanwhile() -> None:
    guard, time, _ = make(max_concurrent=1)
    release = asyncio.Event()

    async def slow_429() -> str:
        await release.wait()
        raise ModelRateLimitError("429", retry_after=4.0)

    first = asyncio.create_task(guard.call(slow_429))
    await asyncio.sleep(0)
    started: list[float] = []
    second = asyncio.create_task(guard.call(answer(time, started)))
    await asyncio.sleep(0)
    assert (guard.in_flight, guard.waiting) == (1, 1)
    release.set()
    with pytest.raises(ModelRateLimitError):
        await first
    assert await second == "ok"
    assert started == [4.0]


async def test_concurrency_cap_holds_however_many_callers() -> None:
    guard, _, _ = make(max_concurrent=3)
    release = asyncio.Event()
    running = 0
    peak = 0

    async def held() -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1
        return "ok"

    tasks = [asyncio.create_task(guard.call(held)) for _ in range(10)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert (guard.in_flight, guard.waiting, running) == (3, 7, 3)
    release.set()
    assert await asyncio.gather(*tasks) == ["ok"] * 10
    assert peak == 3
    assert (guard.in_flight, guard.waiting) == (0, 0)


async def test_breaker_opens_half_opens_and_closes() -> None:
    guard, time, observed = make(failure_threshold=3, cooldown_seconds=5)
    await failing(guard, ModelServerError("500", status=500))
    await failing(guard, ModelTimeoutError("slow"))
    assert guard.state() == "closed"
    await failing(guard, ModelRateLimitError("429 without a hint"))
    assert guard.state() == "open"

    started: list[float] = []
    with pytest.raises(ProviderUnavailableError, match="LLM provider open: retry in 5s"):
        await guard.call(answer(time, started))
    assert started == []

    time.now = 5.0
    assert guard.state() == "half_open"
    release = asyncio.Event()

    async def probe() -> str:
        await release.wait()
        return "back"

    probing = asyncio.create_task(guard.call(probe))
    await asyncio.sleep(0)
    with pytest.raises(ProviderUnavailableError, match="half-open: probe in flight"):
        await guard.call(answer(time, started))  # one probe at a time
    release.set()
    assert await probing == "back"
    assert guard.state() == "closed"
    assert await guard.call(answer(time, started)) == "ok"
    assert observed.refused == {"open": 1, "half_open": 1}
    assert observed.calls == {
        "server_error": 1,
        "timeout": 1,
        "rate_limited": 1,
        "success": 2,
    }


async def test_failed_probes_double_the_cooldown_up_to_the_cap_and_success_resets_it() -> None:
    guard, time, _ = make(failure_threshold=1, cooldown_seconds=5, max_cooldown_seconds=15)
    cooldowns = []
    for _ in range(4):
        await failing(guard, ModelServerError("503", status=503))
        assert guard.state() == "open"
        cooldowns.append(guard.retry_in())
        time.now += guard.retry_in()
        assert guard.state() == "half_open"
    assert cooldowns == [5, 10, 15, 15]
    assert await guard.call(answer(time)) == "ok"  # the probe closes it
    await failing(guard, ModelServerError("503", status=503))
    assert guard.retry_in() == 5


async def test_retry_after_on_a_failed_probe_outlasts_the_cooldown() -> None:
    guard, time, _ = make(failure_threshold=1, cooldown_seconds=5)
    await failing(guard, ModelServerError("500", status=500))
    time.now = 5.0
    await failing(guard, ModelRateLimitError("429", retry_after=40.0))
    assert guard.state() == "open"
    assert guard.retry_in() == 40.0


async def test_success_resets_the_count_and_rejections_neither_count_nor_reset() -> None:
    guard, time, observed = make(failure_threshold=2)
    await failing(guard, ModelServerError("500", status=500))
    await guard.call(answer(time))
    await failing(guard, ModelServerError("500", status=500))
    assert guard.state() == "closed"  # not two in a row
    await failing(guard, ModelResponseError("HTTP 400: bad request"))
    assert guard.state() == "closed"
    await failing(guard, ModelAuthError("HTTP 401: invalid key"))
    assert guard.state() == "open"  # 500, 400 (ignored), 401: two in a row
    assert observed.calls["rejected"] == 1


async def test_bodies_that_are_no_response_are_an_outage_and_it_is_told() -> None:
    """Issue 29: a proxy's HTML page in a 200 counts like a 5xx; ``in_outage`` and
    ``answering_since`` tell a compaction whether the provider is back."""
    guard, time, observed = make(failure_threshold=2, cooldown_seconds=5)
    assert not guard.in_outage() and not guard.answering_since(0)  # no answer yet
    await failing(guard, ModelUnreadableError("expected a ChatCompletion, got str"))
    await failing(guard, ModelUnreadableError("unreadable response body"))
    assert guard.state() == "open" and guard.in_outage()
    assert observed.calls == {"server_error": 2}
    assert not guard.answering_since(0)
    time.now = 5.0
    assert guard.answering_since(0)  # half-open: a call would be the probe
    assert await guard.call(answer(time)) == "ok"
    assert not guard.in_outage() and guard.answering_since(0)
    assert not guard.answering_since(guard.successes)  # nothing answered since


async def test_a_cancelled_probe_gives_no_verdict() -> None:
    guard, time, _ = make(failure_threshold=1)
    await failing(guard, ModelServerError("500", status=500))
    time.now += guard.retry_in()
    hang = asyncio.Event()

    async def hanging() -> str:
        await hang.wait()
        return "never"

    probe = asyncio.create_task(guard.call(hanging))
    await asyncio.sleep(0)
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    assert guard.state() == "half_open"
    assert guard.in_flight == 0
    assert await guard.call(answer(time)) == "ok"
    assert guard.state() == "closed"


async def test_pauses_a_call_sits_out_add_up_to_max_wait() -> None:
    """A pause extended again while a call waits counts against the same wait."""
    guard, time, _ = make(max_wait_seconds=10, failure_threshold=10)
    await failing(guard, ModelRateLimitError("429", retry_after=6.0))
    extended = False

    async def sleep_and_extend(seconds: float) -> None:
        nonlocal extended
        await FakeTime.sleep(time, seconds)
        if not extended:
            extended = True
            await failing(guard, ModelRateLimitError("429", retry_after=6.0))

    guard._sleep = sleep_and_extend
    with pytest.raises(ProviderUnavailableError, match="paused"):
        await guard.call(answer(time))
    assert time.slept == [6.0]


async def test_metrics_report_the_guard() -> None:
    guard, time, _ = make(failure_threshold=1, cooldown_seconds=5)
    metrics = Metrics()
    metrics.watch_provider_guard(guard)

    def scrape() -> str:
        return metrics.render().decode()

    assert label_values(scrape(), "compactor_llm_provider_state", "state") == {
        "closed": 1.0,
        "paused": 0.0,
        "open": 0.0,
        "half_open": 0.0,
    }
    await guard.call(answer(time))
    await failing(guard, ModelServerError("500", status=500))
    with pytest.raises(ProviderUnavailableError):
        await guard.call(answer(time))
    text = scrape()
    assert metric(text, "compactor_llm_provider_state", state="open") == 1.0
    assert label_values(text, "compactor_llm_calls_total", "outcome") == {
        "success": 1.0,
        "server_error": 1.0,
    }
    assert label_values(text, "compactor_llm_calls_refused_total", "state") == {"open": 1.0}
    assert metric(text, "compactor_llm_calls_in_flight") == 0.0
    time.now = 5.0  # no event: the gauge reads the clock
    assert metric(scrape(), "compactor_llm_provider_state", state="half_open") == 1.0


# -- until_answering: a compaction refused in an outage goes again once it answers (issue 20)


async def test_waiters_sleep_through_the_cool_down_and_one_of_them_probes() -> None:
    guard, time, _ = make(failure_threshold=1, cooldown_seconds=5)
    await failing(guard, ModelServerError("503", status=503))
    assert guard.state() == "open"
    since = guard.successes
    await guard.until_answering(since)  # returns when a probe may go: the cool-down's end
    assert time.now == 5.0 and guard.state() == "half_open"


async def test_while_the_probe_is_out_waiters_wait_for_its_verdict_then_go() -> None:
    guard, time, _ = make(failure_threshold=1, cooldown_seconds=5)
    await failing(guard, ModelServerError("503", status=503))
    time.now = 5.0
    release = asyncio.Event()

    async def probe() -> str:
        await release.wait()
        return "back"

    probing = asyncio.create_task(guard.call(probe))
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(guard.until_answering(0)) for _ in range(20)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert not any(w.done() for w in waiters) and time.now == 5.0  # nobody spins or sleeps
    release.set()
    assert await probing == "back"
    await asyncio.gather(*waiters)
    assert guard.state() == "closed"


async def test_a_failed_probe_sends_the_waiters_back_to_sleep_for_the_longer_cool_down() -> None:
    guard, time, _ = make(failure_threshold=1, cooldown_seconds=5, max_cooldown_seconds=15)
    await failing(guard, ModelServerError("503", status=503))
    time.now = 5.0
    release = asyncio.Event()

    async def bad_probe() -> str:
        await release.wait()
        raise ModelServerError("503", status=503)

    probing = asyncio.create_task(guard.call(bad_probe))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(guard.until_answering(0))
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(ModelServerError):
        await probing
    await waiter
    assert time.now == 15.0  # re-opened for 10 s (doubled), then half-open again


async def test_an_answer_to_anyone_releases_the_waiters_of_a_closed_guard() -> None:
    guard, time, _ = make(failure_threshold=3)
    await failing(guard, ModelServerError("503", status=503))  # below the threshold
    waiter = asyncio.create_task(guard.until_answering(guard.successes))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiter.done()  # no answer yet, and nothing to wait out: no call from here
    assert await guard.call(answer(time)) == "ok"
    await waiter
    await guard.until_answering(0)  # answered since: at once


async def test_a_retry_after_pause_waited_out_releases_the_waiters() -> None:
    guard, time, _ = make(max_wait_seconds=1)
    await failing(guard, ModelRateLimitError("429", retry_after=30.0))
    await guard.until_answering(guard.successes)
    assert time.now == 30.0 and guard.state() == "closed"


async def test_a_late_answer_while_the_breaker_is_open_does_not_wake_the_waiters() -> None:
    """A call admitted before the breaker opened may still get its answer: the
    breaker stays open, so the waiters keep sleeping through the cool-down
    instead of all going again only to be refused."""
    guard, time, _ = make(failure_threshold=1, cooldown_seconds=5, max_concurrent=2)
    release = asyncio.Event()

    async def slow_answer() -> str:
        await release.wait()
        return "late"

    late = asyncio.create_task(guard.call(slow_answer))
    await asyncio.sleep(0)
    await failing(guard, ModelServerError("503", status=503))
    assert guard.state() == "open"
    waiter = asyncio.create_task(guard.until_answering(guard.successes))
    await asyncio.sleep(0)
    release.set()
    assert await late == "late"
    await waiter
    assert time.now == 5.0  # it slept the cool-down out, then may probe
