"""A minimal Faust worker, the floor under the accounting agent's pace.

Started as a subprocess by ``bench.accounting_throughput``: it reads the same
messages topic with the same app settings as ``streams.app.build_app`` and
does nothing with each event (``--mode noop``) or only writes one small dict
per event into a changelog-backed table (``--mode table``), so the benchmark
can tell Faust's own per-event cost from the service's. ``GET /count`` says
how many events it has seen, when it saw the first and the last
(``first_at``, ``last_at``: its own clock, exact), and ``lag_ms``: for the last 1 000, the median of
(agent saw it − the record's producer timestamp), the produce → agent hop.

    python -m bench.faust_floor --bootstrap HOST:PORT --topic T --port P --mode table
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import deque
from pathlib import Path

import faust
from faust.web import Request, Response, View


def build(args: argparse.Namespace) -> faust.App:
    app = faust.App(
        args.app_id,
        broker=f"kafka://{args.bootstrap}",
        store=args.store,
        datadir=str(Path(args.datadir) / args.app_id),
        topic_partitions=args.partitions,
        topic_replication_factor=1,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0,
        producer_acks=-1,
        producer_linger=args.linger_ms / 1000.0,
        web_enabled=True,
        web_host="127.0.0.1",
        web_port=args.port,
        web_bind="127.0.0.1",
        web_in_thread=False,
    )
    topic = app.topic(
        args.topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )
    table = app.Table("floor", default=None, partitions=args.partitions, key_type=str)
    seen = [0]
    span = [0.0, 0.0]  # time.time() of the first and the last event seen
    lags: deque[float] = deque(maxlen=1000)

    @app.agent(topic, concurrency=1)
    async def floor(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            now = time.time()
            seen[0] += 1
            span[0] = span[0] or now
            span[1] = now
            lags.append(now - event.message.timestamp)
            if args.mode == "table":
                key = bytes(event.key or b"").decode()
                previous = table.get(key)
                table[key] = {"n": (previous or {}).get("n", 0) + 1, "tokens": 20}

    @app.page("/count")
    class Count(View):
        async def get(self, request: Request) -> Response:
            lag = statistics.median(lags) * 1000 if lags else None
            return self.json(
                {"count": seen[0], "first_at": span[0], "last_at": span[1], "lag_ms": lag}
            )

    @app.page("/healthz")
    class Health(View):
        async def get(self, request: Request) -> Response:
            assignment = app.consumer.assignment() if app.consumer is not None else set()
            return self.json(
                {"assigned_partitions": sorted(f"{tp.topic}:{tp.partition}" for tp in assignment)}
            )

    _ = (floor, Count, Health)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faust_floor", description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--app-id", required=True)
    parser.add_argument("--datadir", required=True)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--mode", choices=["noop", "table"], default="noop")
    parser.add_argument("--store", choices=["memory://", "rocksdb://"], default="memory://")
    parser.add_argument(
        "--linger-ms", type=float, default=0.0, help="producer_linger (the service leaves it 0)"
    )
    args = parser.parse_args(argv)
    Path(args.datadir).mkdir(parents=True, exist_ok=True)
    app = build(args)
    faust.Worker(app, loglevel="warning", quiet=True).execute_from_commandline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
