"""``compactor demo``: the whole service on embedded defaults, in one command.

Starts a throwaway stack (a real Kafka broker and an embedded PostgreSQL,
unless the environment or config names them), runs a worker, replays a
transcript, waits until every conversation is compacted and idle, and prints
what a downstream consumer would see: the clip-archive events and the
compacted history. Everything it started is stopped at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from core.adapters.postgres.embedded import POSTGRES_DSN_ENV
from core.settings import Settings, resolve_model
from devtools import devstack
from streams.addresses import KAFKA_BOOTSTRAP_ENV
from streams.cli.replay import publish, read_events
from streams.cli.tail import summarise, tail
from streams.database import explicit_addresses
from streams.events import ClipArchiveEvent
from streams.kafka.admin import prepare_topics
from streams.kafka.security import PLAINTEXT, KafkaSecurity, kafka_security
from streams.stack_state import dev_stack_bootstrap, dev_stack_dsn
from streams.topics import TopicNames


class DemoError(RuntimeError):
    pass


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


async def _wait_http(url: str, worker: subprocess.Popen[bytes], log: Path, seconds: float) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise DemoError(f"the worker exited ({worker.returncode}); its log:\n{_tail(log)}")
        try:
            body = await asyncio.to_thread(_get_json, url)
            if body.get("assigned_partitions"):
                return body
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            pass
        await asyncio.sleep(0.5)
    raise DemoError(f"the worker did not become ready in {seconds:.0f}s; its log:\n{_tail(log)}")


def say(line: str) -> None:
    """Print, but never fail the demo (and skip its clean-up) on a closed pipe."""
    with contextlib.suppress(BrokenPipeError, OSError):
        print(line, flush=True)


def _processes_mentioning(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _stop_processes_mentioning(marker: str, grace: float = 15.0) -> None:
    """The demo's state dir is a unique temp path: whatever still names it is ours.

    Covers a stack interrupted half-way through ``dev up``, before it could
    record what it started.
    """
    for pid in _processes_mentioning(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _processes_mentioning(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in _processes_mentioning(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


async def _wait_idle(base: str, conversations: list[str], seconds: float) -> dict[str, Any]:
    """Until every conversation has no command outstanding and is within budget."""
    deadline = time.monotonic() + seconds
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        done = 0
        for conversation_id in conversations:
            try:
                state = await asyncio.to_thread(
                    _get_json, f"{base}/conversations/{conversation_id}"
                )
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                continue
            last[conversation_id] = state
            if state["compaction_outstanding"] is None and not state["over_budget"]:
                done += 1
        if done == len(conversations):
            return last
        await asyncio.sleep(0.5)
    raise DemoError(f"conversations still compacting after {seconds:.0f}s: {last}")


async def _show_results(
    bootstrap: str,
    names: TopicNames,
    base: str,
    conversations: list[str],
    states: dict[str, Any],
    security: KafkaSecurity = PLAINTEXT,
) -> None:
    """The clip-archive events on the topic, then each conversation as the model sees it."""
    events: list[ClipArchiveEvent] = []
    await tail(
        bootstrap=bootstrap,
        security=security,
        topic=names.clip_archives,
        from_beginning=True,
        idle_timeout=3,
        as_json=True,
        emit=lambda line: events.append(ClipArchiveEvent.model_validate_json(line)),
    )
    say(f"\n=== {len(events)} clip-archive event(s) on {names.clip_archives} ===")
    for event in events:
        say(summarise(event))
    for conversation_id in conversations:
        state = states[conversation_id]
        history = await asyncio.to_thread(
            _get_json, f"{base}/conversations/{conversation_id}/history"
        )
        say(
            f"\n=== {conversation_id}: {state['token_total']} tokens "
            f"(budget {state['budget_tokens']}), {state['compactions']} compaction(s) ==="
        )
        if history.get("clip_archive"):
            say("\n--- clip-archive (system message) ---")
            say(history["clip_archive"]["content"])
            say("--- end of clip-archive ---")
        say("\n--- kept messages ---")
        for message in history["messages"]:
            if message["id"] == (history.get("clip_archive") or {}).get("id"):
                continue
            text = " ".join(message["content"].split())
            say(f"{message['role']:>9}: {text[:160]}{'…' if len(text) > 160 else ''}")


async def run_demo(settings: Settings, config_path: Path, transcript_path: Path) -> int:
    transcript = read_events(transcript_path)
    if transcript.bad or not transcript.events:
        raise DemoError(f"{transcript_path}: not a valid transcript: {transcript.bad[:3]}")
    resolved = resolve_model(settings.summarization)
    say(f"summariser: {resolved.kind} ({resolved.reason})")

    state_dir = Path(tempfile.mkdtemp(prefix="compactor-demo-"))
    workers: list[subprocess.Popen[bytes]] = []  # the one started, stopped whatever happens
    try:
        bootstrap, dsn = await _start_stack(settings, state_dir)
        names = TopicNames.with_prefix(settings.kafka.topic_prefix)
        security = kafka_security(settings.kafka)
        await prepare_topics(bootstrap, settings.kafka, security=security)
        base = await _start_worker(settings, config_path, state_dir, (bootstrap, dsn), workers)
        result = await publish(
            transcript.events, bootstrap=bootstrap, topic=names.messages, security=security
        )
        say(
            f"replayed {result.published} message events of {transcript_path.name} "
            f"({result.conversations} conversation(s)) to {names.messages}"
        )
        conversations = sorted({event.conversation_id for event in transcript.events})
        states = await _wait_idle(base, conversations, 180)

        await _show_results(bootstrap, names, base, conversations, states, security)
        return 0
    finally:
        await _stop(workers, state_dir)


async def _start_stack(settings: Settings, state_dir: Path) -> tuple[str, str]:
    """Kafka and PostgreSQL (the configured ones, or a local stack): where they are."""
    say("starting Kafka and PostgreSQL ...")
    await devstack.up(
        state_dir,
        explicit_addresses(settings),
        partitions=settings.kafka.partitions,
        say=lambda line: say(f"  {line}"),
    )
    bootstrap = explicit_addresses(settings).kafka_bootstrap or dev_stack_bootstrap(state_dir)
    dsn = explicit_addresses(settings).postgres_dsn or dev_stack_dsn(state_dir)
    if not bootstrap or not dsn:
        raise DemoError("the local stack did not come up")
    return bootstrap, dsn


async def _start_worker(
    settings: Settings,
    config_path: Path,
    state_dir: Path,
    stack: tuple[str, str],
    started: list[subprocess.Popen[bytes]],
) -> str:
    """A worker over ``stack`` (Kafka, PostgreSQL), appended to ``started``; its base URL
    once it answers."""
    bootstrap, dsn = stack
    log_path = state_dir / "worker.log"
    env = {**os.environ, KAFKA_BOOTSTRAP_ENV: bootstrap, POSTGRES_DSN_ENV: dsn}
    with log_path.open("wb") as log:
        # Popen returns at once; the worker runs on its own.
        worker = subprocess.Popen(  # noqa: ASYNC220
            [sys.executable, "-m", "streams.cli", "--config", str(config_path), "worker"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    started.append(worker)
    base = f"http://{settings.service.web_host}:{settings.service.web_port}"
    say(f"starting a worker (log: {log_path}) ...")
    await _wait_http(f"{base}/healthz", worker, log_path, 90)
    return base


async def _stop(workers: list[subprocess.Popen[bytes]], state_dir: Path) -> None:
    """The worker (SIGTERM, then kill after 30 s), the stack, and what it left."""
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
    try:
        await devstack.down(state_dir, say=lambda line: None)
    finally:
        await asyncio.to_thread(_stop_processes_mentioning, str(state_dir))
        shutil.rmtree(state_dir, ignore_errors=True)
