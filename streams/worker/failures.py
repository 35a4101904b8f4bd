"""What accounting does when a record's effect could not be made durable.

A record is only acknowledged once its effect is durable, so a failed try is
tried again on the same records, which also holds back the rest of their
partitions (the agent is busy with them); every step is idempotent, so a
retried record is written once. ``FailurePolicy.decide`` (after Kafka
Streams' ``ProcessingExceptionHandler``) says what follows a failure:

* an outage (``StoreUnavailable``, ``PublisherUnavailable``): wait, with
  backoff, for as long as it lasts;
* data the store refuses for good (``StoreRejected``): dead-letter it at once,
  no waiting, since a retry gets the same answer;
* anything else (a bug, a record breaking an assumption): retry up to
  ``max_attempts`` times, then dead-letter it as ``processing_error``, so one
  poisonous record cannot hold a partition forever, and nothing is dropped
  without a trace.

A group is never dead-lettered whole: it is split, each record tried alone,
so only the culprit is. The ports say which errors are outages: the adapters
map their drivers' exceptions at the edge (``core.adapters.postgres.errors``,
``streams.kafka.errors``), so this policy imports no driver.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from core.ports.publisher import PublisherUnavailable
from core.ports.storage import StoreRejected, StoreUnavailable
from streams.metrics import Metrics
from streams.worker.dead_letters import SendDeadLetter
from streams.worker.health import Health
from streams.worker.records import InvalidRecord, Record
from streams.worker.retry import jittered_backoff_seconds

log = logging.getLogger("compactor.worker")

_OUTAGES: tuple[type[BaseException], ...] = (StoreUnavailable, PublisherUnavailable)


def is_outage(error: BaseException) -> bool:
    return isinstance(error, _OUTAGES)


@dataclass(frozen=True)
class Split:
    """Give the group up as a whole: try each record alone, to find the culprit."""


@dataclass(frozen=True)
class DeadLetter:
    """Give the lone record up: to the dead-letter topic, with ``reason``."""

    reason: InvalidRecord


@dataclass(frozen=True)
class Wait:
    """Wait ``delay`` seconds, then try the same records again, or, with ``then``,
    give them up that way (the last failed try is backed off like the others)."""

    delay: float
    then: Split | DeadLetter | None = None


Decision = Wait | DeadLetter | Split


@dataclass(frozen=True)
class FailurePolicy:
    max_attempts: int = 5
    backoff: Callable[[int], float] = jittered_backoff_seconds

    @staticmethod
    def counts_as_attempt(error: Exception) -> bool:
        """Is the failure a try worth waiting on (reported, backed off, counted)? All
        but a rejection: that is given up at once, attempts or no."""
        return not isinstance(error, StoreRejected)

    def decide(self, error: Exception, attempts: int, records: int) -> Decision:
        """What follows a failure of ``records`` records, ``attempts`` tries counted."""
        if isinstance(error, StoreRejected):
            return _give_up(records, store_rejected(error))
        delay = self.backoff(attempts)
        if is_outage(error) or attempts < self.max_attempts:
            return Wait(delay)
        return Wait(delay, then=_give_up(records, processing_error(error, attempts)))


def _give_up(records: int, reason: InvalidRecord) -> Split | DeadLetter:
    return Split() if records > 1 else DeadLetter(reason)


def processing_error(error: Exception, failures: int) -> InvalidRecord:
    return InvalidRecord(
        f"could not be processed after {failures} attempts: {type(error).__name__}: {error}"[:1000],
        "processing_error",
    )


def store_rejected(error: StoreRejected) -> InvalidRecord:
    return InvalidRecord(f"the store refuses this record: {error}"[:1000], "store_rejected")


def describe(record: Record) -> str:
    return f"{record.topic}[{record.partition}]@{record.offset}"


Attempt = Callable[[Sequence[Record]], Awaitable[set[str]]]


class Durably:
    """Runs an attempt on records until it succeeds or the policy gives them up,
    while their partitions stay assigned here; ``/healthz`` and the metrics say
    when it waits."""

    def __init__(
        self,
        policy: FailurePolicy,
        *,
        dead_letter: SendDeadLetter,
        metrics: Metrics,
        health: Health,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        still_assigned: Callable[[Record], bool] = lambda _: True,
    ) -> None:
        self._policy = policy
        self._dead_letter = dead_letter
        self._metrics = metrics
        self._health = health
        self._sleep = sleep
        self._still_assigned = still_assigned

    async def run(self, records: Sequence[Record], attempt: Attempt) -> set[str]:
        """What ``attempt`` returned (conversation keys touched); nothing when the
        records were given up or their partitions revoked."""
        failures = 0
        pending = list(records)
        while True:
            try:
                touched = await attempt(pending)
            except Exception as error:
                if self._policy.counts_as_attempt(error):
                    failures += 1
                    self._waiting(pending[0], error, failures)
                    pending = [record for record in pending if self._still_assigned(record)]
                    if not pending:
                        log.warning(
                            "abandoning %s: its partition was revoked", describe(records[0])
                        )
                        return set()
                decision = self._policy.decide(error, failures, len(pending))
                if isinstance(decision, Wait):
                    await self._sleep(decision.delay)
                    if decision.then is None:
                        continue
                    decision = decision.then
                return await self._give_up(decision, pending, failures, attempt)
            if failures:
                self._recovered(pending[0], failures)
            return touched

    async def _give_up(
        self, decision: Split | DeadLetter, pending: list[Record], failures: int, attempt: Attempt
    ) -> set[str]:
        match decision:
            case Split():
                touched: set[str] = set()
                for record in pending:
                    touched |= await self.run([record], attempt)
                return touched
            case DeadLetter(reason):
                await self._dead_letter(pending[0], reason)
                if failures:
                    self._recovered(pending[0], failures)
                return set()

    def _waiting(self, record: Record, error: Exception, failures: int) -> None:
        kind = type(error).__name__
        self._metrics.accounting_retries.labels(kind).inc()
        self._metrics.accounting_waiting.set(1)
        outage = "outage" if is_outage(error) else "error"
        self._health.report(
            "accounting", f"{outage} on {describe(record)}, attempt {failures}: {kind}: {error}"
        )
        if failures == 1 or failures % 20 == 0:  # once, then every few minutes
            log.warning(
                "accounting %s failed (%s, attempt %d), retrying the same records: %s: %s",
                describe(record),
                outage,
                failures,
                kind,
                error,
                extra={"partition": record.partition},
            )

    def _recovered(self, record: Record, failures: int) -> None:
        self._metrics.accounting_waiting.set(0)
        self._health.clear("accounting")
        log.warning(
            "accounting resumed at %s after %d failed attempts",
            describe(record),
            failures,
            extra={"partition": record.partition},
        )
