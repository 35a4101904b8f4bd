"""``[service].log_format = "json"``: every stderr line one JSON object.

A subprocess configures logging as ``compactor worker`` does with JSON logs
(``streams.logs.configure``, then a ``faust.Worker`` told not to configure
logging again) and logs through Faust's, mode's, aiokafka's and the worker's
loggers, and a Python warning; the real worker is checked in
tests/e2e/test_json_logs.py.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from streams.logs import configure, json_formatter, log_context

pytestmark = pytest.mark.unit

SCRIPT = textwrap.dedent(
    """
    import logging, warnings
    from streams.logs import configure, log_context
    configure("json", "info")
    import faust
    app = faust.App("json-logs-test", broker="kafka://127.0.0.1:1", store="memory://")
    worker = faust.Worker(app, loglevel="info", quiet=True, override_logging=False)
    assert not worker.override_logging
    logging.getLogger("faust.worker").info("faust says %s", "hello")
    logging.getLogger("mode.services").warning("mode says hello")
    logging.getLogger("aiokafka.conn").error("Unable connect to %r", "127.0.0.1:1")
    with log_context(conversation_id="c-42", partition=3):
        logging.getLogger("compactor.worker").info(
            "compaction k-1 of c-42 requested", extra={"compaction_id": "k-1"}
        )
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("compactor.scheduler").exception("compaction of c-42 crashed")
    warnings.warn("a warning")
    """
)


def test_every_stderr_line_is_json_with_level_logger_message() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]
    assert len(records) >= 6, done.stderr
    for record in records:
        assert {"time", "level", "logger", "message"} <= record.keys()
    by_logger = {r["logger"]: r for r in records}
    assert {"faust.worker", "mode.services", "aiokafka.conn", "py.warnings"} <= by_logger.keys()
    processed = by_logger["compactor.worker"]
    assert processed["conversation_id"] == "c-42"
    assert processed["compaction_id"] == "k-1"
    assert processed["partition"] == 3
    assert processed["level"] == "INFO"
    assert "ValueError: boom" in by_logger["compactor.scheduler"]["exc_info"]
    assert done.stdout == ""


def test_text_format_stays_text_and_extra_wins_over_context() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    try:
        configure("text", logging.INFO, stream=stream)
        logging.getLogger("compactor.test").info("plain %d", 1)
        handler = configure("json", logging.INFO, stream=stream)
        with log_context(conversation_id="outer"):
            logging.getLogger("compactor.test").info("x", extra={"conversation_id": "inner"})
        handler.flush()
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in before[0]:
            root.addHandler(handler)
        root.setLevel(before[1])
    text_line, json_line = stream.getvalue().splitlines()
    assert "INFO compactor.test: plain 1" in text_line
    assert json.loads(json_line)["conversation_id"] == "inner"


def test_audit_log_shares_the_formatter() -> None:
    from streams.http import audit

    record = logging.LogRecord(
        "compactor.audit", logging.INFO, __file__, 1, "http_read", None, None
    )
    line = json.loads(audit.formatter().format(record))
    assert line["event"] == "http_read" and line["logger"] == "compactor.audit"
    assert "level" not in line
    assert json.loads(json_formatter().format(record))["level"] == "INFO"


# -- the lines a failing start writes ---------------------------------------------------


def compactor(
    tmp_path: Path, *args: str, config: str, script: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``compactor --config … ARGS`` in a subprocess, with no PostgreSQL (nor dev stack)
    and a Kafka address nothing is asked of before the checks refuse to start."""
    (tmp_path / "config.toml").write_text(config, encoding="utf-8")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("COMPACTOR_", "POSTGRES_", "KAFKA_"))
    }
    env |= {
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "COMPACTOR_DEV_STATE_DIR": str(tmp_path / "no-dev-stack"),
    }
    code = script or "import sys; from streams.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, "--config", str(tmp_path / "config.toml"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """Every line of ``stderr``, each of which must be a JSON object with level and message."""
    records = []
    for line in stderr.splitlines():
        record = json.loads(line)  # raises on a line that is not JSON
        assert isinstance(record, dict), line
        assert {"level", "message"} <= record.keys(), line
        records.append(record)
    assert records, "nothing was written"
    return records


JSON_CONFIG = '[service]\nlog_format = "json"\n'


def test_a_worker_without_postgres_says_so_in_json(tmp_path: Path) -> None:
    done = compactor(tmp_path, "worker", config=JSON_CONFIG)
    assert done.returncode == 2, done.stderr
    records = json_lines(done.stderr)
    fatal = [r for r in records if r["level"] == "ERROR"]
    assert len(fatal) == 1 and "POSTGRES_DSN" in fatal[0]["message"], records
    assert done.stdout == ""


def test_with_text_logs_the_same_refusal_stays_one_plain_line(tmp_path: Path) -> None:
    done = compactor(tmp_path, "worker", config="")
    assert done.returncode == 2
    last = done.stderr.splitlines()[-1]
    assert last.startswith("compactor: no PostgreSQL configured: set POSTGRES_DSN")


def test_a_bad_config_key_is_refused_in_json(tmp_path: Path) -> None:
    done = compactor(tmp_path, "worker", config=JSON_CONFIG + "web_prot = 6066\n")
    assert done.returncode == 2, done.stderr
    (fatal,) = json_lines(done.stderr)
    assert fatal["level"] == "ERROR" and "web_prot" in fatal["message"]


def test_a_crash_at_start_is_one_json_line_with_its_traceback(tmp_path: Path) -> None:
    crash = textwrap.dedent(
        """
        import sys
        import streams.cli.worker
        def crash(settings):
            raise RuntimeError("boom")
        streams.cli.worker.worker_bootstrap = crash
        from streams.cli import main
        sys.exit(main(sys.argv[1:]))
        """
    )
    done = compactor(tmp_path, "worker", config=JSON_CONFIG, script=crash)
    assert done.returncode == 1, done.stderr
    (fatal,) = json_lines(done.stderr)
    assert fatal["level"] == "CRITICAL" and fatal["message"] == "RuntimeError: boom"
    assert "Traceback" in fatal["exc_info"] and "crash" in fatal["exc_info"]
