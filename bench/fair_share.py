"""Fair share across tenants (issue 18, part 5): does tenant A's burst starve tenant B?

Tenant A puts ``--burst`` conversations over budget at once, tenant B
``--others`` (10), each just after A's; every LLM call takes ``--latency-ms``
(500). Measured: B's latency from its compaction command reaching the
worker's scheduler to its compaction's end (where the clip-archive is
published), p50 and p95, in three runs made the same way:

* **B alone**: B's commands with nobody else's;

B is an active tenant in every run: one compaction of its own in the 10 s
before (the guard keeps a quarter of its call slots from a tenant while
another is active, ``core.fair_slots``, headroom);
* **FIFO**: A's burst first, then B's, with ``[summarization].fair_share =
  false`` (one queue for the compaction slots and the guard's call slots, as
  before);
* **fair share**: the same with ``fair_share = true`` (the default): the
  slots in turns by tenant.

What runs is what decides the queueing: the worker's ``CompactionScheduler``
(``max_concurrent_compactions`` slots, one command at a time per
conversation) and its ``ProviderGuard`` (``max_concurrent_llm_calls`` call
slots), with their defaults, and a compaction that is one LLM call of the
latency through the guard. No store, broker or summariser: their cost is the
same few milliseconds per compaction in every run (docs/performance.md), and
in one process they would make the event loop, not the slots, the queue
(the in-memory store of the component tests scans every row per call).

Target: B's p95 with A bursting under fair share ≤ 2 × B's p95 alone.

    python -m bench.fair_share [--burst 1000] [--others 10] [--latency-ms 500]
    python -m bench.fair_share --quick      # 200 and 10, 200 ms
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from core.compaction.factory import guard_limits
from core.domain.compaction import CompactionTuning
from core.domain.tenancy import conversation_key, tenant_of
from core.provider_guard import ProviderGuard
from streams.worker.scheduler import CompactionScheduler


@dataclass
class Run:
    name: str
    b_latencies: list[float]
    a_latencies: list[float]
    seconds: float

    def p(self, q: float, values: list[float] | None = None) -> float:
        values = sorted(self.b_latencies if values is None else values)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, round(q * (len(values) - 1)))]


async def run_once(name: str, fair: bool, burst: int, others: int, latency: float) -> Run:
    # The loop's clock measures and paces everything, so a test can run this on a
    # loop with virtual time (looptime): the same queueing, no wall-clock noise.
    clock = asyncio.get_running_loop().time
    tuning = CompactionTuning(fair_share=fair)
    guard = ProviderGuard(guard_limits(tuning), clock=clock)

    async def ack(_: int) -> None:
        return None

    scheduler: CompactionScheduler[int] = CompactionScheduler(
        ack, max_concurrent=128, fair_share=fair
    )
    done: dict[str, float] = {}
    submitted: dict[str, float] = {}

    def compaction(key: str) -> Callable[[], Awaitable[None]]:
        async def work() -> None:
            await guard.call(lambda: asyncio.sleep(latency), tenant=tenant_of(key))
            done[key] = clock()

        return work

    a_keys = [conversation_key("tenant-a", f"a-{n:04d}") for n in range(burst)]
    b_keys = [conversation_key("tenant-b", f"b-{n:04d}") for n in range(others)]
    # B is an active tenant: one compaction in the minute before (every run alike).
    await scheduler.submit(
        partition="p0",
        offset=0,
        token=0,
        conversation_id="tenant-b/warm",
        work=compaction("tenant-b/warm"),
    )
    await scheduler.drain()
    started = clock()
    for offset, key in enumerate([*a_keys, *b_keys], start=1):
        submitted[key] = clock()
        await scheduler.submit(
            partition="p0", offset=offset, token=offset, conversation_id=key, work=compaction(key)
        )
    await scheduler.drain()
    seconds = clock() - started
    return Run(
        name,
        [done[k] - submitted[k] for k in b_keys],
        [done[k] - submitted[k] for k in a_keys],
        seconds,
    )


def report(runs: list[Run], args: argparse.Namespace) -> None:
    alone, fifo, fair = runs
    print(
        f"\nA: {args.burst} conversations over budget at once, B: {args.others} just after; "
        f"LLM {args.latency_ms} ms per call; max_concurrent_llm_calls 64, "
        f"max_concurrent_compactions 128 (the defaults)\n"
    )
    print("| run | B p50 | B p95 | B p95 ÷ alone | A p95 | all done in |")
    print("| --- | --- | --- | --- | --- | --- |")
    for run in runs:
        a95 = run.p(0.95, run.a_latencies) if run.a_latencies else float("nan")
        print(
            f"| {run.name} | {run.p(0.5):.2f} s | {run.p(0.95):.2f} s | "
            f"{run.p(0.95) / alone.p(0.95):.1f}× | "
            + ("–" if a95 != a95 else f"{a95:.2f} s")
            + f" | {run.seconds:.1f} s |"
        )
    ratio = fair.p(0.95) / alone.p(0.95)
    verdict = "met" if ratio <= 2.0 else "MISSED"
    print(
        f"\nB's p95 with A bursting, fair share: {ratio:.2f}× alone (target ≤ 2×: {verdict}); "
        f"FIFO: {fifo.p(0.95) / alone.p(0.95):.1f}×. "
        f"B's mean alone {statistics.mean(alone.b_latencies):.2f} s."
    )


async def main_async(args: argparse.Namespace) -> list[Run]:
    latency = args.latency_ms / 1000
    return [
        await run_once("B alone", True, 0, args.others, latency),
        await run_once("A bursting, FIFO", False, args.burst, args.others, latency),
        await run_once("A bursting, fair share", True, args.burst, args.others, latency),
    ]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--others", type=int, default=10)
    parser.add_argument("--latency-ms", type=int, default=500)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.burst, args.others, args.latency_ms = 200, 10, 200
    return args


def main() -> None:
    args = parse_args()
    print("# Fair share across tenants (bench/fair_share.py)")
    runs = asyncio.run(main_async(args))
    report(runs, args)


if __name__ == "__main__":
    main()
