"""The side a chat platform touches at every turn (issue 27): the context it sends
its model, read from one real worker while ingest runs.

One worker (openai provider: the LLM test server, every reply after
``--latency-ms``), budget 0.5 x 8,000 = 4,000 tokens, ``--big`` conversations of
``--turns`` turns compacted before anything is measured. Background traffic at
``--rate`` events/s goes to 200 other conversations throughout (they go over
budget and are compacted too). Then:

1. **turns** (for each ``--readers`` count, ``--seconds`` each): every reader is a
   platform's turn loop over one of the big conversations: publish a turn
   (acks=all), ``GET /context?format=messages&after=<partition:offset>&wait_ms=5000``
   (publish-to-readable: from the send to the answer that includes it; a 409, not
   stored within the wait, counts as its wait, a lower bound), then
   ``format=openai`` (a **cold** read: the history changed since that shape was
   last served, so it is loaded and fitted), the same again (**cached**: one
   version lookup), and the baseline in the same loop: the whole ``/history``
   (``limit=1000``: the paged read a platform used before, converting it itself).
   Reported: p50/p95/p99 per kind, turns/s, any non-200 (a 429 is the rate limit),
   and what the compactions did meanwhile (the pace's cost): committed per
   second, the mean compaction limit, and how much the backlog of issued, not
   yet finished commands grew (> 0: they fell behind the background).
   Back to back by default: the readers' turns queue at the worker, so the
   latencies measure its read capacity (Little's law). ``--think-ms`` paces each
   reader as a platform is paced, a model call between two turns.
2. **fit** (provider down): conversations pushed over the window while every
   summary call fails, read cold at ``fit=budget`` (fitted: a provisional
   clip-archive) and ``fit=none`` (the same rows, not fitted): the p95 ratio.
3. **burst**: ``--burst`` conversations receive 300 turns at once with the
   provider answering after ``--latency-ms``; a reader polls both ``/history``
   and ``/context`` every 50 ms: the peak handed out / window and / budget, and the
   seconds each was over the window, until the LLM compactions land.

    python -m bench.turn_read [--readers 1 4 16 64] [--rate 1000] [--json FILE]
    python -m bench.turn_read --quick
    python -m bench.turn_plot FILE --out docs/performance-turns.png   # the figure
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from bench.compaction_latency import CountingLLMServer
from bench.harness import (
    Infra,
    create_topics,
    new_worker,
    note,
    print_header,
    produce,
    running,
    table,
    unique_prefix,
    wait_assigned,
    worker_config,
)
from bench.turn_traffic import (
    BUDGET,
    WINDOW,
    CompactionSide,
    Latencies,
    LoopLag,
    Traffic,
    Turns,
    conversation_events,
    settled,
)
from tests.support.llm_server import OPENAI_CHAT_PATH, ServerError
from tests.support.worker import wait_for_split


async def turn_phase(
    worker_urls: list[str],
    turns: Turns,
    conversations: list[str],
    readers: int,
    seconds: float,
    think: float = 0.0,
) -> dict[str, Any]:
    """``readers`` turn loops over the big conversations for ``seconds``, spread
    over the workers as a load balancer would (a worker forwards a read of a
    conversation it does not own to the one that does)."""
    kinds = ("publish_to_readable", "ack", "cold", "cached", "history")
    latencies = {kind: Latencies() for kind in kinds}
    statuses: dict[int, int] = {}
    deadline = time.monotonic() + seconds
    async with contextlib.AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(
                aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=readers + 4))
            )
            for url in worker_urls
        ]

        async def loop(n: int) -> None:
            cid = conversations[n % len(conversations)]
            http = sessions[n % len(sessions)]
            while time.monotonic() < deadline:
                await turns.one(http, cid, latencies, statuses)
                if think:  # the platform's model call before its next turn
                    await asyncio.sleep(think * random.uniform(0.5, 1.5))

        started = time.monotonic()
        async with LoopLag() as lag, CompactionSide(worker_urls) as side:
            await asyncio.gather(*(loop(n) for n in range(readers)))
        elapsed = time.monotonic() - started
    row: dict[str, Any] = {"readers": readers, "seconds": round(elapsed, 1), "think_s": think}
    row["bench_loop_lag"] = lag.late.summary()
    row["compactions"] = side.summary(elapsed)
    row["turns_per_s"] = round(latencies["cold"].count / elapsed, 1)
    for kind in kinds:
        row[kind] = latencies[kind].summary()
    row["not_200"] = {str(k): v for k, v in statuses.items() if k != 200}
    return row


async def fit_phase(
    worker_url: str, llm: CountingLLMServer, bootstrap: str, topic: str, reads: int
) -> dict[str, Any]:
    """Fitted vs plain cold reads of conversations held over the window."""
    llm.enqueue(*[ServerError(503)] * 100_000, path=OPENAI_CHAT_PATH)
    ids = [f"fit-{n}" for n in range(4)]
    await produce(bootstrap, topic, conversation_events(ids, 260))
    fitted, plain = Latencies(), Latencies()
    turns = Turns(bootstrap, topic)
    await turns.start()
    try:
        async with aiohttp.ClientSession(worker_url) as http:
            for n in range(reads):
                cid = ids[n % len(ids)]
                await turns.publish_and_wait(http, cid)
                order = [("budget", fitted), ("none", plain)]
                for fit, into in order if n % 2 else order[::-1]:
                    await turns.timed_get(http, cid, {"format": "openai", "fit": fit}, into)
    finally:
        await turns.stop()
        llm.reset()
    ratio = fitted.p(95) / plain.p(95) if plain.count else float("nan")
    return {"fitted": fitted.summary(), "plain": plain.summary(), "p95_ratio": round(ratio, 2)}


async def burst_phase(
    worker_url: str, llm: CountingLLMServer, bootstrap: str, topic: str, count: int
) -> dict[str, Any]:
    """``count`` conversations receive 300 turns at once; what a poller is handed."""
    ids = [f"burst-{n}" for n in range(count)]
    peaks = {"history": 0, "context": 0}
    over_window = {"history": 0.0, "context": 0.0}
    timeline: list[tuple[float, int, int]] = []  # (s, largest /history, largest /context)
    async with aiohttp.ClientSession(worker_url) as http:
        sending = asyncio.create_task(produce(bootstrap, topic, conversation_events(ids, 300)))
        started, last = time.monotonic(), time.monotonic()
        while not sending.done() or not await settled(http, ids, 300):
            now = time.monotonic()
            largest = {"history": 0, "context": 0}
            for cid in ids:
                for source, tokens in (await _handed_out(http, cid)).items():
                    peaks[source] = max(peaks[source], tokens)
                    largest[source] = max(largest[source], tokens)
                    if tokens > WINDOW:
                        over_window[source] += (now - last) / len(ids)
            timeline.append((round(now - started, 2), largest["history"], largest["context"]))
            last = now
            if now - started > 600:
                break
            await asyncio.sleep(0.05)
        await sending
    return {
        "conversations": count,
        "llm_latency_s": llm.latency_seconds,
        "settled_s": round(time.monotonic() - started, 1),
        **{f"{s}_peak_tokens": peaks[s] for s in peaks},
        **{f"{s}_peak_per_window": round(peaks[s] / WINDOW, 2) for s in peaks},
        **{f"{s}_peak_per_budget": round(peaks[s] / BUDGET, 2) for s in peaks},
        **{f"{s}_seconds_over_window": round(over_window[s], 1) for s in peaks},
        "window": WINDOW,
        "budget": BUDGET,
        "timeline": timeline,
    }


async def _handed_out(http: aiohttp.ClientSession, cid: str) -> dict[str, int]:
    handed: dict[str, int] = {}
    async with http.get(f"/conversations/{cid}/history", params={"limit": "1000"}) as r:
        if r.status == 200:
            handed["history"] = int((await r.json())["token_estimate"])
    async with http.get(f"/conversations/{cid}/context", params={"format": "openai"}) as r:
        if r.status == 200:
            handed["context"] = int((await r.json())["token_estimate"])
    return handed


def config(args: argparse.Namespace, prefix: str, llm_url: str) -> dict[str, Any]:
    shaped = worker_config(
        topic_prefix=prefix, store=args.store, max_concurrent_compactions=args.compactions,
        budget=(0.5, WINDOW), llm_base_url=llm_url, pool_max_size=None,
    )  # fmt: skip
    shaped["summarization"]["timeout_seconds"] = 30.0
    return shaped


async def run(args: argparse.Namespace, infra: Infra) -> dict[str, Any]:
    assert infra.bootstrap is not None
    dsn = await infra.new_database()
    prefix = unique_prefix("turns")
    names = await create_topics(infra.bootstrap, prefix, infra.partitions)
    async with CountingLLMServer() as llm:
        shaped = config(args, prefix, llm.openai_base_url)
        workers = [new_worker(infra, f"w{n + 1}", dsn, shaped) for n in range(args.workers)]
        try:
            with contextlib.ExitStack() as stack:
                for worker in workers:
                    stack.enter_context(running(worker))
                if len(workers) == 1:
                    await wait_assigned(workers[0], names.messages, infra.partitions)
                else:
                    await wait_for_split(workers, names.messages, infra.partitions, timeout=180)
                try:
                    urls = [worker.url for worker in workers]
                    results = await measure(args, infra.bootstrap, names.messages, urls, llm)
                    results["workers"] = len(workers)
                    results["gate_refusals"] = sum(
                        (Counter(gate_refusals(w.log_path)) for w in workers), Counter()
                    )
                    return results
                except Exception as error:
                    gone = [w for w in workers if not w.alive]
                    if not gone:
                        raise
                    # A phase's connection refused says nothing: say why the worker went.
                    tail = gone[0].log_tail(80)
                    raise RuntimeError(f"{gone[0].name} exited; log:\n{tail}") from error
        finally:
            if args.keep_log is not None:
                shutil.copyfile(workers[0].log_path, args.keep_log)
                for other in workers[1:]:  # PATH.w2, ...
                    shutil.copyfile(other.log_path, f"{args.keep_log}.{other.name}")


def gate_refusals(log_path: Path) -> dict[str, int]:
    """Compactions the gate refused, by reason, from the worker's log: a stand-in
    whose summaries are all refused measures the extractive fallback, not a model."""
    found = re.findall(r"rejected by the gate \((\w+)", log_path.read_text(errors="replace"))
    return dict(Counter(found))


async def measure(
    args: argparse.Namespace, bootstrap: str, topic: str, urls: list[str], llm: CountingLLMServer
) -> dict[str, Any]:
    url = urls[0]
    big = [f"big-{n:02d}" for n in range(args.big)]
    note(f"setup: {args.big} conversations of {args.turns} turns, compacted")
    await produce(bootstrap, topic, conversation_events(big, args.turns))
    async with aiohttp.ClientSession(url) as http:
        await settled(http, big, args.turns, wait=600)
    llm.latency_seconds = args.latency_ms / 1000
    traffic = Traffic(bootstrap, topic, args.rate, mix=args.mix)
    results: dict[str, Any] = {
        "rate": args.rate,
        "mix": args.mix,
        "big": args.big,
        "turns": args.turns,
    }
    async with traffic:
        turns = Turns(bootstrap, topic)
        await turns.start()
        try:
            results["turns_by_readers"] = []
            for readers in args.readers:
                note(f"turns: {readers} readers for {args.seconds:g} s")
                row = await turn_phase(
                    urls, turns, big, readers, args.seconds, args.think_ms / 1000
                )
                results["turns_by_readers"].append(row)
                note(f"{readers} readers: {json.dumps(row)}")  # kept if a later phase fails
        finally:
            await turns.stop()
        results["background_events_per_s"] = round(traffic.achieved(), 1)
        note("fit: provider down, reads fitted and not")
        results["fit"] = await fit_phase(url, llm, bootstrap, topic, args.fit_reads)
    note(f"burst: {args.burst} conversations x 300 turns at once")
    results["burst"] = await burst_phase(url, llm, bootstrap, topic, args.burst)
    return results


def report(results: dict[str, Any]) -> None:
    rows = []
    for row in results["turns_by_readers"]:
        cells = [row["readers"], row["turns_per_s"]]
        for kind in ("publish_to_readable", "ack", "cold", "cached", "history"):
            cells.append("{p50} / {p95} / {p99}".format(**row[kind]))
        lag = row.get("bench_loop_lag", {})
        cells.append("{p50} / {p95} / {p99}".format(**lag) if lag else "-")
        side = row.get("compactions", {})
        cells.append("{per_s} / {limit_mean} / {backlog_grew:+g}".format(**side) if side else "-")
        rows.append((*cells, json.dumps(row["not_200"]) if row["not_200"] else "-"))
    heads = ("readers", "turns/s", "publish->readable ms", "of which the ack ms", "context cold ms",
             "context cached ms", "/history (baseline) ms", "bench's own loop lag ms",
             "compactions/s / mean limit / backlog", "not 200")  # fmt: skip
    think = results["turns_by_readers"][0].get("think_s", 0) if results["turns_by_readers"] else 0
    paced = f"a {think:g} s pause between turns" if think else "turns back to back"
    print(f"\nturn loops, {results.get('workers', 1)} worker(s), {paced}, background "
          f"{results['background_events_per_s']} events/s, {results.get('mix', 'round-robin')} "
          "(p50 / p95 / p99)")  # fmt: skip
    print(table(heads, rows))
    fit = results["fit"]
    print(f"\nfit (provider down): fitted p95 {fit['fitted']['p95']} ms, plain p95 "
          f"{fit['plain']['p95']} ms: ratio {fit['p95_ratio']}")  # fmt: skip
    burst = {k: v for k, v in results["burst"].items() if k != "timeline"}
    print("\nburst: " + json.dumps(burst))
    print(f"gate refusals (LLM summaries, by reason): {results.get('gate_refusals') or 'none'}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readers", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=1000.0, help="background events/s")
    parser.add_argument(
        "--mix",
        choices=["round-robin", "varied"],
        default="round-robin",
        help="background conversations in turn (one wave of compactions) or at varied speeds",
    )
    parser.add_argument("--big", type=int, default=16, help="conversations read")
    parser.add_argument("--turns", type=int, default=700, help="turns of each")
    parser.add_argument("--latency-ms", type=float, default=2000.0)
    parser.add_argument(
        "--think-ms", type=float, default=0.0, help="each reader's pause between turns (mean)"
    )
    parser.add_argument("--fit-reads", type=int, default=200)
    parser.add_argument("--burst", type=int, default=6)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--keep-log",
        type=Path,
        help="copy the first worker's log here (the others' to PATH.w2, ...)",
    )
    parser.add_argument("--workers", type=int, default=1, help="workers of one service")
    parser.add_argument(
        "--store", choices=["rocksdb://", "memory://"], default="rocksdb://", help="table store"
    )
    parser.add_argument(
        "--compactions", type=int, help="[service].max_concurrent_compactions (default: shipped)"
    )
    parser.add_argument("--quick", action="store_true")
    if "--quick" in sys.argv:  # smaller defaults; options given still win
        parser.set_defaults(readers=[1, 4], seconds=3.0, rate=200.0, big=4, turns=200,
                            fit_reads=40, burst=2, latency_ms=500.0)  # fmt: skip
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    random.seed(7)
    print_header("turn-time reads: the context a platform sends its model", "bench.turn_read")
    with Infra(partitions=4) as infra:
        print(infra.describe())
        results = asyncio.run(run(args, infra))
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
