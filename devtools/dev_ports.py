"""A restarted broker's ports: the recorded ones, free again, or an error naming who holds them."""

from __future__ import annotations

import contextlib
import os
import re
import socket
from pathlib import Path

from devtools.dev_processes import KafkaPorts, read_line_value, stop_service
from devtools.dev_services import DevStackError, Say
from streams.kafka.probe import LOOPBACK
from streams.stack_state import KAFKA, PROCESSES, StackState, process_cmdline, state_path


def _port_free(port: int) -> bool:
    """Whether the broker could listen on ``port`` (a TIME_WAIT left by a dead one is fine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _port_holder(port: int) -> str | None:
    """``pid N (command)`` of the process listening on ``port``, as far as ``/proc`` tells."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()
                if len(fields) > 9 and fields[3] == "0A" and fields[1].endswith(f":{port:04X}"):
                    inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for proc_dir in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in (proc_dir / "fd").iterdir()):
                argv = (process_cmdline(int(proc_dir.name)) or b"").replace(b"\0", b" ")
                return f"pid {proc_dir.name} ({argv.decode(errors='replace').strip()[:100]})"
    return None


def _recorded_controller_port(data_dir: Path) -> int | None:
    """The controller port in the broker's last ``server.properties``, if there is one."""
    listeners = read_line_value(data_dir / "server.properties", "listeners=") or ""
    match = re.search(r"CONTROLLER://[^,]*:(\d+)", listeners)
    return int(match.group(1)) if match else None


def kafka_ports_to_reuse(state_dir: Path, state: StackState, say: Say) -> KafkaPorts:
    """The ports a restarted broker must take again: the ones recorded before.

    Workers and other commands were given the recorded bootstrap address, and a
    broker on a new port is one they never find again. So a recorded client port
    taken by another process is an error naming it, never a quiet move; the
    controller port, which only the broker itself uses, moves with a note.
    """
    if state.launcher != PROCESSES or not state.kafka_bootstrap:
        return (None, None)
    stop_service(state, KAFKA, say)  # a broker JVM its killed launcher left behind
    try:
        port = int(state.kafka_bootstrap.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return (None, None)
    if not _port_free(port):
        holder = _port_holder(port) or "another process"
        raise DevStackError(
            f"cannot restart Kafka on {state.kafka_bootstrap}, the address recorded in "
            f"{state_path(state_dir)} that workers and other commands were given: port {port} "
            f"is now taken by {holder}.\nTo fix: stop that process and run `compactor dev up` "
            "again; or run `compactor dev down` and `compactor dev up` to start the stack on "
            "new ports (then restart whatever was given the old address)"
        )
    controller = _recorded_controller_port((state_dir / KAFKA).resolve())
    if controller is not None and not _port_free(controller):
        holder = _port_holder(controller) or "another process"
        say(
            f"Kafka's controller port {controller} (internal, clients never use it) is taken "
            f"by {holder}: the broker gets a new one, its client port stays {port}"
        )
        controller = None
    return (port, controller)
