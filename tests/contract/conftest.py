"""The contract suite: one test of each storage port's behaviour, run over the
in-memory store and PostgreSQL alike (as quixstreams' state parity tests run
one suite over each backend). The contract is PostgreSQL's behaviour: where
the fake differs, the fake is fixed. The PostgreSQL runs are ``integration``
tests (a real database per test, ``tests/conftest.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.contract.backends import Backend, MemoryBackend, PostgresBackend


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.integration)])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "memory":
        return MemoryBackend()
    return PostgresBackend(request.getfixturevalue("pg_store"))


@pytest.fixture
def store(backend: Backend) -> Any:
    return backend.store
