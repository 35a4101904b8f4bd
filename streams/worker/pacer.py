"""The compaction limit as the worker lives it: delays in from ingest, a limit out
to the scheduler (the rule is ``core.domain.pace``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from core.domain.pace import Baseline, PaceRule, on_delay, on_demand, on_time, start
from core.domain.pace import observe as observe_baseline


class CompactionPacer:
    """``stored(published_at)`` after each group; ``limit(wanted)`` before each slot."""

    def __init__(
        self,
        rule: PaceRule,
        *,
        on_limit: Callable[[int], None] = lambda _: None,
        on_late: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.rule = rule
        self._clock = clock
        now = clock()
        self._pace = start(rule, now)
        self._baseline = Baseline(window_start=now)
        self._on_limit = on_limit
        self._on_late = on_late
        self._cut: list[Callable[[], None]] = []
        on_limit(self._pace.limit)

    @property
    def current(self) -> int:
        return self._pace.limit

    def when_cut(self, callback: Callable[[], None]) -> None:
        """``callback`` runs when a late group lowers the limit (the scheduler resizes)."""
        self._cut.append(callback)

    def stored(self, published_at: float) -> None:
        """A group is stored; its newest message was published at ``published_at``
        (the record's timestamp, seconds since the epoch)."""
        if not self.rule.paced:
            return
        now = self._clock()
        delay = now - published_at
        if delay > self.rule.window_seconds:
            return  # not a turn: an import with its original times, or a long backlog
        self._baseline = observe_baseline(self.rule, self._baseline, delay, now)
        excess = delay - self._baseline.value
        before = self._pace.limit
        self._pace = on_delay(self.rule, self._pace, excess, now)
        if excess > self.rule.target_seconds:
            self._on_late()
        if self._pace.limit != before:
            self._on_limit(self._pace.limit)
            for callback in self._cut:
                callback()

    def limit(self, wanted: int) -> int:
        """The limit now, ``wanted`` compactions running or waiting for a slot."""
        before = self._pace.limit
        self._pace = on_demand(on_time(self.rule, self._pace, self._clock(), wanted), wanted)
        if self._pace.limit != before:
            self._on_limit(self._pace.limit)
        return self._pace.limit
