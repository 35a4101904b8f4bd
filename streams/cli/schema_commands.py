"""``compactor schemas``: write, or check, the JSON Schema of every wire event."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core.settings import Settings
from streams.cli import schemas


def cmd_schemas(_: Settings, args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.check:
        problems = schemas.stale_files(out)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("run `compactor schemas` to regenerate", file=sys.stderr)
            return 1
        print(f"{out}: {len(schemas.WIRE_EVENTS)} event schemas up to date")
        return 0
    written = schemas.write_schemas(out)
    for path in written:
        print(f"wrote {path}")
    print(f"{out}: {len(schemas.WIRE_EVENTS)} event schemas ({len(written)} changed)")
    return 0
