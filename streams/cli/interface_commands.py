"""``compactor openapi`` (the HTTP API's contract) and ``compactor completion`` (shell)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import shtab

from core.settings import ServiceSettings, Settings
from streams.http import openapi

DEFAULT_DOCUMENT = Path("docs/openapi.json")

_Subparsers = Any  # argparse's _SubParsersAction, private


def add_interface_commands(sub: _Subparsers) -> None:
    document = sub.add_parser(
        "openapi", help="print the HTTP API's OpenAPI 3.1 document (this config's bounds)"
    )
    document.add_argument("--out", help="write it to this file instead of printing it")
    document.add_argument(
        "--check",
        action="store_true",
        help=f"only check that {DEFAULT_DOCUMENT} (the defaults' document) is up to date",
    )
    completion = sub.add_parser(
        "completion",
        help='print a shell completion script: eval "$(compactor completion bash)"',
    )
    completion.add_argument("shell", choices=shtab.SUPPORTED_SHELLS)


def cmd_openapi(settings: Settings, args: argparse.Namespace) -> int:
    if args.check:
        expected = openapi.render(openapi.document(ServiceSettings()))
        found = DEFAULT_DOCUMENT.read_text(encoding="utf-8") if DEFAULT_DOCUMENT.exists() else ""
        if found != expected:
            print(
                f"{DEFAULT_DOCUMENT} differs from the views' models: run "
                f"`compactor openapi --out {DEFAULT_DOCUMENT}` with no config file",
                file=sys.stderr,
            )
            return 1
        print(f"{DEFAULT_DOCUMENT}: up to date")
        return 0
    text = openapi.render(openapi.document(settings.service))
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"wrote {args.out}")
    else:
        sys.stdout.write(text)
    return 0


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    return shtab.complete(parser, shell=shell)
