"""The planning's steps whose work grows with the turns' text, run off the event loop.

The worker's one event loop also runs every Kafka consumer's heartbeat, the
agents and the probes: a step that reads every character of a compaction's
turns (importance scoring, the specifics ledger) must not run on it, however
bounded each call is. ``ThreadOffload`` runs such a step in a thread of the
executor it is given: the worker's own, a few threads its runtime opens and
shuts (``streams.bootstrap``), so a compaction's steps never take the threads
the loop resolves host names with; ``None``, the loop's default executor (the
CLI, tests). The steps are pure (``core.domain``): they share nothing with the
loop but the frozen values they read.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Protocol, TypeVar

T = TypeVar("T")

WORKER_THREADS = 2
"""The worker's planning threads: the steps are Python code, which one core runs
at a time (the GIL), so more threads would only queue more steps at once."""


class Offload(Protocol):
    """Runs ``work`` somewhere the event loop does not wait for, and returns its result."""

    async def __call__(self, work: Callable[[], T]) -> T: ...


@dataclass(frozen=True)
class ThreadOffload:
    """``work`` in a thread of ``executor`` (None: the loop's default executor)."""

    executor: Executor | None = None

    async def __call__(self, work: Callable[[], T]) -> T:
        context = contextvars.copy_context()  # as asyncio.to_thread: the caller's context
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, partial(context.run, work))


def planning_threads() -> ThreadPoolExecutor:
    """The worker's executor for planning steps; its owner shuts it down."""
    return ThreadPoolExecutor(max_workers=WORKER_THREADS, thread_name_prefix="compaction")
