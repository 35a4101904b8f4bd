"""Ports and processes for the local brokers: free ports, pids, stopping, parent death."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from streams.kafka.probe import LOOPBACK
from streams.stack_state import pid_alive


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct free ports (each socket held until all are picked)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def runs_broker(pid: int, properties: Path) -> bool:
    """Whether ``pid`` is a live broker reading ``properties``.

    A stale pid file (broker killed, machine rebooted) may name a pid that
    now belongs to something else entirely.
    """
    if not pid_alive(pid):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc: trust the pid
    return str(properties).encode() in argv


def stop_process(pid: int, timeout: float = 20.0) -> bool:
    """Stop a broker this process did not start (``dev down``): SIGTERM, then SIGKILL.

    A broker leads its own process group, so the group is signalled when the
    pid leads one. Returns False if the process was already gone.
    """
    if not pid_alive(pid):
        return False
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return True
            time.sleep(0.1)
    return True


def tail_text(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def parent_death_preexec() -> Callable[[], None] | None:
    """A pre-exec hook that has the kernel SIGKILL the broker when its parent dies.

    Without it a crashed test session leaves a JVM holding ports and half a
    gigabyte until someone notices. libc is looked up here, in the parent,
    because importing or loading anything between fork and exec can deadlock.
    Linux only; elsewhere the broker simply outlives a crashed parent.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL))

    return preexec
