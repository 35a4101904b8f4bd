"""How long a worker's ``/livez`` takes to answer, polled from another process.

Why another process: the test's own event loop runs the LLM stand-in, the
producer and the collectors; a poll made from it would also measure the test's
stalls. The poller (``python -m tests.support.loop_probe URL``) asks every
``interval`` seconds on a new connection, as a kubelet's probe does, and
prints one JSON line per answer: how long it took and its status (``null`` for
no answer within ``timeout``). It exits when its stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import pytest


@dataclass(frozen=True)
class Poll:
    seconds: float
    status: int | None


@dataclass
class LivezProbe:
    """Polls ``url`` from a subprocess; ``polls`` are its answers so far."""

    url: str
    interval: float = 0.02
    timeout: float = 60.0
    polls: list[Poll] = field(default_factory=list)
    _process: asyncio.subprocess.Process | None = None
    _reader: asyncio.Task[None] | None = None

    async def start(self) -> LivezProbe:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", __name__, self.url, str(self.interval), str(self.timeout),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        async for line in self._process.stdout:
            found = json.loads(line)
            self.polls.append(Poll(found["seconds"], found["status"]))

    @property
    def slowest(self) -> float:
        return max((p.seconds for p in self.polls), default=0.0)

    def check(self, limit: float) -> None:
        """Fails the test (at once, through any ``eventually``) when an answer so far
        took longer than ``limit`` or was not a 200."""
        failed = [p for p in self.polls if p.status != 200]
        if failed:
            pytest.fail(f"/livez did not answer 200: {failed[:5]}")
        if self.slowest > limit:
            pytest.fail(
                f"/livez took {self.slowest:.3f}s (limit {limit}s) over {len(self.polls)} polls"
            )

    async def stop(self) -> None:
        process = self._process
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), timeout=self.timeout + 5)
        except TimeoutError:
            process.kill()
            await process.wait()
        if self._reader is not None:
            await self._reader


def _poll(url: str, timeout: float) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # loopback
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return None


def main(url: str, interval: float, timeout: float) -> None:
    closed = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), closed.set()), daemon=True).start()
    while not closed.is_set():
        started = time.perf_counter()
        status = _poll(url, timeout)
        seconds = time.perf_counter() - started
        print(json.dumps({"seconds": round(seconds, 4), "status": status}), flush=True)
        closed.wait(max(0.0, interval - seconds))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))
