"""CHANGELOG.md records every release by its commit, this version first."""

from __future__ import annotations

import pytest

from tests.support.releases import previous_release, project_version, releases

pytestmark = pytest.mark.unit


def test_this_version_is_the_newest_entry_and_says_how_its_commit_is_found() -> None:
    newest = releases()[0]
    assert newest.version == project_version()
    assert newest.commit is None
    assert f'version = "{project_version()}"' in newest.commit_line


def test_every_earlier_release_names_its_commit_newest_first() -> None:
    found = releases()
    assert len(found) >= 3
    for release in found[1:]:
        assert release.commit is not None, release
    versions = [tuple(int(part) for part in r.version.split(".")) for r in found]
    assert versions == sorted(versions, reverse=True)
    assert [r.date for r in found] == sorted((r.date for r in found), reverse=True)


def test_the_previous_release_is_the_second_entry() -> None:
    assert previous_release() == releases()[1]
