"""The preview that replaces an offloaded turn reads its head and tail only.

Why: a turn may hold 1,000,000 characters (a pasted log). The preview's
specifics were found by scanning all of it, in a worker thread but in regex
calls that hold the GIL up to 65 ms each: the worker's event loop stalled and
``/livez`` took 0.28 s in a clean-clone CI run (tests/e2e/test_large_messages.py).
"""

from __future__ import annotations

from core.compaction.strategies.offload_oversized import preview
from core.domain.long_text import READ_HEAD_CHARS, READ_TAIL_CHARS
from tests.support.plans import msg

FILLER = "plain words with nothing exact in them at all\n"


def test_the_preview_lists_specifics_of_the_head_and_tail_not_of_the_middle() -> None:
    middle = FILLER * (200_000 // len(FILLER))
    content = (
        "deploy of /srv/app/release.tar started\n"
        + FILLER * (READ_HEAD_CHARS // len(FILLER))
        + middle.replace(FILLER, "the mirror is at /mnt/middle/only.img\n", 1)
        + FILLER * (READ_TAIL_CHARS // len(FILLER))
        + "failed with INC-4711\n"
    )
    shown = preview(msg(1, content))
    specifics = shown.rsplit("Specifics: ", 1)[1]
    assert "/srv/app/release.tar" in specifics and "INC-4711" in specifics
    assert "/mnt/middle/only.img" not in specifics
    assert f"{len(content)} characters archived" in shown
