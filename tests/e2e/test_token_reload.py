"""A real worker re-reads its tokens on SIGHUP, and keeps them when the file is bad.

Why here too: the handler is installed by a Faust app task when the worker
starts; without it SIGHUP's default action would end the worker.
"""

from __future__ import annotations

import hashlib
import signal

import pytest

from tests.e2e.conftest import Stack, eventually
from tests.support.worker import WorkerProcess, render_toml

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(180)]

OLD = "e2e-reload-old-token-0123456789"
NEW = "e2e-reload-new-token-0123456789"


async def test_sighup_swaps_the_tokens_of_a_running_worker(stack: Stack) -> None:
    config = {section: dict(values) for section, values in stack.config().items()}
    config.setdefault("service", {})["api_tokens"] = [OLD]
    worker = WorkerProcess(
        stack.root, "reload", bootstrap=stack.bootstrap, dsn=stack.dsn, config=config
    )
    worker.token = OLD
    stack.workers.append(worker)
    worker.start()
    await worker.wait_ready(stack.names.messages)
    path = "/conversations/nobody/history"

    async def store_open() -> None:  # 500 until the worker has opened PostgreSQL
        assert (await worker.get(path, token=OLD))[0] == 404

    await eventually(store_open, timeout=30, what="the worker reads PostgreSQL")
    assert (await worker.get(path, token=NEW))[0] == 401

    def rewrite(tokens: list[str]) -> None:
        worker.config["service"]["api_tokens"] = tokens
        worker.config_path.write_text(render_toml(worker.config), encoding="utf-8")

    rewrite(["sha256:" + hashlib.sha256(NEW.encode()).hexdigest()])
    assert worker.process is not None
    worker.process.send_signal(signal.SIGHUP)

    async def swapped() -> None:
        assert (await worker.get(path, token=NEW))[0] == 404
        assert (await worker.get(path, token=OLD))[0] == 401

    await eventually(swapped, timeout=10, what="the new token is in force")
    rewrite([OLD, OLD])  # a duplicate: refused, the new token stays
    worker.process.send_signal(signal.SIGHUP)

    async def logged() -> None:
        assert "token reload failed" in worker.log_text()

    await eventually(logged, timeout=10, what="the failed reload is logged")
    assert worker.alive
    assert (await worker.get(path, token=NEW))[0] == 404
    assert (await worker.get(path, token=OLD))[0] == 401
    assert OLD not in worker.log_text() and NEW not in worker.log_text()
