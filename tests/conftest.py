"""Shared fixtures: one PostgreSQL per test session, one fresh database per test.

``pg_dsn`` is ``$POSTGRES_DSN`` when set (its role needs CREATEDB), otherwise
a throwaway embedded server started once per session. Each test that asks
for ``pg_database`` (or ``pg_store``) gets its own database cloned from a
template migrated once per session: cloning takes ~0.1 s, far less than
migrating, and no test can see another's rows.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import pytest
from hypothesis import settings as hypothesis_settings

from core.adapters.postgres.embedded import POSTGRES_DSN_ENV, start_temporary
from core.adapters.postgres.migrate import migrate
from core.adapters.postgres.store import PostgresStore

# In CI the property tests draw the same examples every run (derandomize): a run
# that fails fails again on the same input, and a new random find cannot block a
# landing unannounced. On a developer's machine they explore anew each time.
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
    hypothesis_settings.load_profile("ci")


def dsn_for_database(dsn: str, database: str) -> str:
    """``dsn`` pointing at ``database`` instead (URI-style DSNs, as asyncpg takes)."""
    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("dbname", "database")]
    return urlunsplit(parts._replace(path=f"/{database}", query=urlencode(query)))


def _unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


async def _create_database(admin_dsn: str, name: str, template: str | None = None) -> None:
    admin = await asyncpg.connect(admin_dsn)
    try:
        clause = f' TEMPLATE "{template}"' if template else ""
        await admin.execute(f'CREATE DATABASE "{name}"{clause}')
    finally:
        await admin.close()


async def _drop_database(admin_dsn: str, name: str) -> None:
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """Admin DSN of the session's PostgreSQL server."""
    configured = os.environ.get(POSTGRES_DSN_ENV)
    if configured:
        yield configured
        return
    handle = start_temporary()
    try:
        yield handle.dsn
    finally:
        handle.stop()


@pytest.fixture(scope="session")
async def pg_template(pg_dsn: str) -> AsyncIterator[str]:
    """Name of a database migrated once per session, cloned by ``pg_database``."""
    name = _unique_name("compactor_template")
    await _create_database(pg_dsn, name)
    try:
        await migrate(dsn_for_database(pg_dsn, name))
        yield name
    finally:
        await _drop_database(pg_dsn, name)


@pytest.fixture
async def pg_database(pg_dsn: str, pg_template: str) -> AsyncIterator[str]:
    """DSN of a fresh, fully migrated database private to this test."""
    name = _unique_name("compactor_test")
    await _create_database(pg_dsn, name, template=pg_template)
    try:
        yield dsn_for_database(pg_dsn, name)
    finally:
        await _drop_database(pg_dsn, name)


@pytest.fixture
async def pg_empty_database(pg_dsn: str) -> AsyncIterator[str]:
    """DSN of a fresh database with no migrations applied."""
    name = _unique_name("compactor_empty")
    await _create_database(pg_dsn, name)
    try:
        yield dsn_for_database(pg_dsn, name)
    finally:
        await _drop_database(pg_dsn, name)


@pytest.fixture
async def pg_store(pg_database: str) -> AsyncIterator[PostgresStore]:
    """A ``PostgresStore`` (no embedder) on this test's own database."""
    store = await PostgresStore.connect(pg_database, max_size=4)
    try:
        yield store
    finally:
        await store.close()


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def require_local_kafka_tools() -> None:
    """Java 17+ and the broker jars, or skip (locally) / fail (CI) saying what is missing.

    A CI run that silently skipped every Kafka test would look green while
    testing nothing.
    """
    from devtools.localstack import MissingToolError, ensure_kafka_jars, find_java

    try:
        find_java()
        ensure_kafka_jars()
    except MissingToolError as exc:
        if in_ci():
            pytest.fail(f"CI must run the Kafka tests, but: {exc}", pytrace=False)
        pytest.skip(f"no local Kafka: {exc}")


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real broker for the whole session: ``$KAFKA_BOOTSTRAP_SERVERS`` (CI starts
    one) or a local KRaft broker from the Maven jars. Use your own topic names."""
    from devtools.localstack import start_kafka

    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        yield external
        return
    require_local_kafka_tools()
    with start_kafka(tmp_path_factory.mktemp("kafka-session")) as broker:
        yield broker.bootstrap_servers
