"""The releases CHANGELOG.md records, read for the tests that need them.

``tests/chaos/test_upgrade.py`` runs the previous release's workers: its
commit comes from here, the one place it is written.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CHANGELOG = REPO_ROOT / "CHANGELOG.md"

_HEADING = re.compile(r"^## \[(?P<version>\d+\.\d+\.\d+)\] - (?P<date>\d{4}-\d{2}-\d{2})$")
_COMMIT = re.compile(r"^Commit: (?P<rest>.+)$")
_HASH = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Release:
    version: str
    date: str
    commit_line: str  # what follows "Commit: "

    @property
    def commit(self) -> str | None:
        """The full hash, or None for the newest release (its line says how to find it)."""
        text = self.commit_line.strip()
        return text if _HASH.match(text) else None


def releases(text: str | None = None) -> list[Release]:
    """Every release of the changelog, newest first."""
    lines = (CHANGELOG.read_text(encoding="utf-8") if text is None else text).splitlines()
    found: list[Release] = []
    current: tuple[str, str] | None = None
    for line in lines:
        if heading := _HEADING.match(line):
            current = (heading["version"], heading["date"])
        elif current is not None and (commit := _COMMIT.match(line)):
            found.append(Release(current[0], current[1], commit["rest"]))
            current = None
    return found


def project_version() -> str:
    with (REPO_ROOT / "pyproject.toml").open("rb") as file:
        return str(tomllib.load(file)["project"]["version"])


def previous_release() -> Release:
    """The release before this one: the second entry (the first is this version)."""
    found = releases()
    if len(found) < 2 or found[0].version != project_version():
        raise AssertionError(
            f"CHANGELOG.md must list this version ({project_version()}) first and the "
            f"previous release after it; found {[r.version for r in found]}"
        )
    previous = found[1]
    if previous.commit is None:
        raise AssertionError(
            f"CHANGELOG.md: release {previous.version} names no commit "
            f"(Commit: <40-hex hash>), found {previous.commit_line!r}"
        )
    return previous
