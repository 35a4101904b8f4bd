"""The seen-nonce set of forwarded requests: no replay is ever accepted, memory is
bounded, and the work per request does not grow with the set."""

from __future__ import annotations

import time

import pytest

from streams.http.nonces import SeenNonces

pytestmark = pytest.mark.unit


def test_a_nonce_is_accepted_once_while_its_signature_could_be_fresh() -> None:
    now = [100.0]
    seen = SeenNonces(window=30, capacity=10, clock=lambda: now[0])
    assert seen.record("n1", 1000.0) == "new"
    assert seen.record("n1", 1000.0) == "replayed"
    now[0] += 59.9  # a signature up to 30 s ahead is fresh for 60 s after arrival
    assert seen.record("n1", 1000.0) == "replayed"
    now[0] += 0.2
    assert seen.record("n2", 1060.0) == "new"
    assert len(seen) == 1  # n1 expired and left


def test_a_full_set_drops_the_oldest_and_refuses_what_was_signed_before_it() -> None:
    now = [0.0]
    seen = SeenNonces(window=30, capacity=3, clock=lambda: now[0])
    for n, stamp in enumerate((10.0, 11.0, 12.0)):
        assert seen.record(f"n{n}", stamp) == "new"
    assert seen.record("n3", 13.0) == "new"  # n0 dropped: the floor is its stamp
    assert len(seen) == 3 and seen.floor == 10.0
    assert seen.record("n0", 10.0) == "below_floor"  # the dropped one, replayed
    assert seen.record("late", 9.5) == "below_floor"  # signed before the floor
    assert seen.record("n3", 13.0) == "replayed"


def test_the_work_per_nonce_does_not_grow_with_the_set() -> None:
    now = [0.0]
    seen = SeenNonces(window=30, capacity=50_000, clock=lambda: now[0])
    for n in range(50_000):
        seen.record(f"fill-{n}", float(n))
    started = time.perf_counter()
    for n in range(5_000):
        assert seen.record(f"more-{n}", 100_000.0 + n) == "new"
    elapsed = time.perf_counter() - started
    assert len(seen) == 50_000
    assert elapsed < 0.5, f"5,000 nonces past a full set took {elapsed:.2f} s"
