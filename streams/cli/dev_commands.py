"""The local-stack commands: ``dev up|down|status`` and ``demo``.

``devtools`` (the JVM broker's launcher, Maven, docker compose) is imported
inside these commands only, never at module level: the worker's import path
goes through ``streams.cli`` and must not load it
(tests/unit/test_import_layering.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from core.settings import ConfigError, Settings
from streams.cli.errors import CommandError
from streams.database import explicit_addresses
from streams.stack_state import DEV_STATE_DIR_ENV, default_state_dir

if TYPE_CHECKING:
    from devtools.devstack import ServiceReport


def _say(line: str) -> None:
    print(line, flush=True)


async def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from devtools.demo import DemoError, run_demo
    from devtools.devstack import DevStackError

    if not args.config:
        raise ConfigError("demo needs --config (the README uses samples/demo.toml)")
    try:
        return await run_demo(settings, Path(args.config), Path(args.transcript))
    except (DemoError, DevStackError) as error:
        raise CommandError(str(error)) from None


async def cmd_dev(settings: Settings, args: argparse.Namespace) -> int:
    from devtools import devstack

    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir()
    try:
        if args.dev_command == "down":
            return await _dev_down(state_dir)
        if args.dev_command == "status":
            return await _dev_status(settings, state_dir)
        reports = await devstack.up(
            state_dir, explicit_addresses(settings), partitions=settings.kafka.partitions, say=_say
        )
    except devstack.DevStackError as error:
        raise CommandError(str(error)) from None
    _print_up(reports, state_dir)
    return 0


async def _dev_down(state_dir: Path) -> int:
    from devtools import devstack

    if await devstack.down(state_dir, say=_say):
        print(f"dev stack in {state_dir} stopped")
    else:
        print(f"nothing to stop: no dev stack recorded in {state_dir}")
    return 0


async def _dev_status(settings: Settings, state_dir: Path) -> int:
    from devtools import devstack

    reports = await devstack.status(state_dir, explicit_addresses(settings))
    for report in reports:
        print(report.line())
    healthy = all(report.answering for report in reports)
    if not healthy:
        print("not all services answer: `compactor dev up` starts what is missing")
    return 0 if healthy else 1


def _print_up(reports: list[ServiceReport], state_dir: Path) -> None:
    """What ``dev up`` found or started, and the exports other tools need to find it."""
    from devtools import devstack

    if all(report.source in ("already running", "configured") for report in reports):
        print(f"dev stack already up ({state_dir}):")
    else:
        print(f"dev stack up ({state_dir}):")
    for report in reports:
        print("  " + report.line())
    exports = devstack.export_lines(reports, state_dir)
    if exports:
        if any(line.startswith(f"export {DEV_STATE_DIR_ENV}=") for line in exports):
            print("compactor commands find it once the last line below is set; other tools:")
        else:
            print(
                "compactor commands run from this directory find it by themselves; "
                "other tools, or other directories:"
            )
        for line in exports:
            print(f"  {line}")
    print("stop it with `compactor dev down`")
