"""The README's "Running it yourself" walk-through, read as commands.

``tests/e2e/test_walkthrough.py`` runs them; ``tests/unit/test_docs.py``
checks them cheaply. Both read the README itself, so a walk-through that
stops working (a missing config, a renamed command) fails a test.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SECTION = "## Running it yourself"
COMPACTOR = ".venv/bin/compactor"
_BLOCK = re.compile(r"```sh\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Step:
    """One line of the walk-through: its program and arguments (comment stripped)."""

    line: str
    argv: tuple[str, ...]

    @property
    def is_compactor(self) -> bool:
        return self.argv[0] == COMPACTOR

    def compactor_command(self) -> str | None:
        """The subcommand (``worker``, ``dev``, ...) of a compactor line, after any options."""
        if not self.is_compactor:
            return None
        args = list(self.argv[1:])
        while args and args[0].startswith("-"):
            args = args[2:] if args[0] == "--config" else args[1:]
        return args[0] if args else None

    def config(self) -> str | None:
        """The ``--config FILE`` of a compactor line, if it names one."""
        args = self.argv[1:]
        for i, arg in enumerate(args[:-1]):
            if arg == "--config":
                return args[i + 1]
        return None


def walkthrough_steps(readme: str | None = None) -> list[Step]:
    """The commands of the first ``sh`` block under "Running it yourself"."""
    text = README.read_text(encoding="utf-8") if readme is None else readme
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end != -1 else len(text)]
    block = _BLOCK.search(section)
    if block is None:
        raise AssertionError(f"no ```sh block under {SECTION!r} in README.md")
    steps = []
    for raw in block.group(1).splitlines():
        argv = shlex.split(raw, comments=True)
        if argv:
            steps.append(Step(raw.strip(), tuple(argv)))
    return steps
