"""The worker's import path never reaches the dev tooling.

Why: ``devtools`` is what starts a JVM broker, runs Maven and docker compose
for ``compactor dev``/``demo``. The worker, and every other command, only
needs to *read* where a running dev stack is (``streams.stack_state``) and
to probe a broker (``streams.kafka.probe``). A module-level ``from devtools
import ...`` anywhere on that path would put the launcher back into every
worker process, so a fresh interpreter (which nothing else in this session
has imported into) imports the worker's entry points and lists what came
along.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from streams import stack_state

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

#: What a worker (``compactor worker``) and the non-dev commands import.
WORKER_PATH = (
    "streams.cli",
    "streams.bootstrap",
    "streams.app",
    "streams.addresses",
    "streams.http.views",
)

#: Where the launcher lived before ``devtools``: a copy left there would bring it back.
FORMER_LAUNCHERS = ("streams.localstack", "streams.devstack", "streams.demo")

#: The light modules the worker imports instead; they must not start processes.
LIGHT_MODULES = (ROOT / "streams" / "stack_state.py", ROOT / "streams" / "kafka" / "probe.py")

PROBE = """
import json, sys
for name in sys.argv[1:]:
    __import__(name)
print(json.dumps(sorted(sys.modules)))
"""


def test_the_worker_import_path_loads_no_dev_tooling() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *WORKER_PATH],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(WORKER_PATH) <= set(loaded)
    dev_tooling = [
        name
        for name in loaded
        if name == "devtools" or name.startswith("devtools.") or name in FORMER_LAUNCHERS
    ]
    assert dev_tooling == [], f"importing {', '.join(WORKER_PATH)} loaded {dev_tooling}"


@pytest.mark.parametrize("path", LIGHT_MODULES, ids=lambda path: path.name)
def test_the_light_modules_cannot_launch_processes(path: Path) -> None:
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"subprocess", "devtools", "multiprocessing", "asyncio"}


@pytest.mark.parametrize(
    "module", [stack_state.KAFKA_LAUNCHER_MODULE, stack_state.POSTGRES_LAUNCHER_MODULE]
)
def test_the_recorded_launcher_modules_exist(module: str) -> None:
    """``owns_pid`` recognises ``dev up``'s processes by these names in their command line,
    and ``dev up`` runs them with ``python -m``: a rename must update both."""
    assert importlib.util.find_spec(module) is not None
