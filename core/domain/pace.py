"""How many compactions may run at once: fewer while the turns fall behind.

Why: compactions come in waves (conversations that started together reach
their budget together), and ~200 at once saturate a small machine's cores: a
platform's new message then took 0.65-2 s to be readable, against ~30 ms
otherwise (docs/performance.md, section 10). A turn must not wait for a
compaction; a compaction can wait, since a read meanwhile is fitted within the
budget without one (``core.domain.context_fit``).

So the limit is paced as TCP paces a window. It starts at the floor and
doubles each round in which more compactions wanted a slot than it allowed and
no message was late; a round that wanted fewer brings it back towards twice
what was used (a quiet worker meets the next wave at the floor, not at the
ceiling). A message stored later than the target after it was published
halves it at once, at most once a round. The floor keeps compactions going
whatever the messages do. A round in which no message was stored at all has
no turn to keep waiting (a backlog of compactions after a burst, an outage's
queue at night): the limit goes straight to what was wanted, up to the
ceiling, instead of doubling.

Lateness is measured against a baseline: the least delay seen in the last two
windows, so a producer whose clock is behind by a constant does not read as
late for ever. A backlog that lasts longer than a window becomes the baseline
too, and the limit grows again: compactions then share the cores with the
catch-up instead of waiting for its end. A group published more than a window
ago says nothing of the turns (an import sent with its original times, a long
backlog) and is not counted at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class PaceRule:
    floor: int
    ceiling: int
    target_seconds: float  # a message later than this over the baseline is late; 0: no pacing
    round_seconds: float = 1.0
    window_seconds: float = 60.0

    def __post_init__(self) -> None:
        if not 1 <= self.floor <= self.ceiling:
            raise ValueError("need 1 <= floor <= ceiling")
        if self.round_seconds <= 0 or self.window_seconds <= 0:
            raise ValueError("round_seconds and window_seconds must be > 0")

    @property
    def paced(self) -> bool:
        return self.target_seconds > 0


@dataclass(frozen=True)
class Pace:
    limit: int
    round_start: float
    wanted: int = 0  # the most compactions running or waiting at once this round
    cut_at: float = -math.inf
    late: bool = False  # a late message this round
    turns: bool = False  # a message stored this round, late or not


@dataclass(frozen=True)
class Baseline:
    """The least delay of the current window and of the one before it."""

    window_start: float
    least: float = math.inf
    least_before: float = math.inf

    @property
    def value(self) -> float:
        least = min(self.least, self.least_before)
        return 0.0 if math.isinf(least) else least


def start(rule: PaceRule, now: float) -> Pace:
    return Pace(limit=rule.floor if rule.paced else rule.ceiling, round_start=now)


def on_demand(pace: Pace, wanted: int) -> Pace:
    """``wanted`` compactions are running or waiting for a slot now."""
    return replace(pace, wanted=wanted) if wanted > pace.wanted else pace


def on_delay(rule: PaceRule, pace: Pace, excess: float, now: float) -> Pace:
    """A group of messages was stored ``excess`` seconds later than the baseline."""
    if not rule.paced:
        return pace
    if excess <= rule.target_seconds:
        return pace if pace.turns else replace(pace, turns=True)
    if now - pace.cut_at < rule.round_seconds:
        return replace(pace, late=True, turns=True)
    return replace(pace, limit=max(rule.floor, pace.limit // 2), cut_at=now, late=True, turns=True)


def on_time(rule: PaceRule, pace: Pace, now: float, wanted: int) -> Pace:
    """The rounds ended by ``now``: the limit grown or brought back towards use,
    and a new round begun with ``wanted`` compactions running or waiting."""
    if not rule.paced or now - pace.round_start < rule.round_seconds:
        return pace
    limit = pace.limit
    if pace.wanted > limit and not pace.turns:
        limit = min(rule.ceiling, pace.wanted)
    elif pace.wanted > limit and not pace.late:
        limit = min(rule.ceiling, limit * 2)
    elif pace.wanted < limit:
        limit = max(rule.floor, min(limit, 2 * pace.wanted))
    return Pace(limit=limit, round_start=now, wanted=wanted, cut_at=pace.cut_at)


def observe(rule: PaceRule, baseline: Baseline, delay: float, now: float) -> Baseline:
    """``baseline`` with a group's delay (publish to stored) seen at ``now``."""
    delay = max(0.0, delay)
    if now - baseline.window_start >= rule.window_seconds:
        recent = now - baseline.window_start < 2 * rule.window_seconds
        before = baseline.least if recent else math.inf
        return Baseline(window_start=now, least=delay, least_before=before)
    if delay < baseline.least:
        return replace(baseline, least=delay)
    return baseline
