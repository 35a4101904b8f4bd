"""Send the service's real summarisation requests to a real small model, by hand,
and run the product's gate on what it answers (devtools/real_model/README.md).

The requests are built by the product's own code (``build_summarization_request``,
rendered by the OpenAI adapter's ``build_messages``), answered by
``complete.mjs`` (node-llama-cpp, outside the project's environment), and each
answer goes through what the summariser does with a model's text (strip, the
specifics ledger) and then ``check_compaction``, twice: as the pipeline applies
it (the batch remembers its turns' ranked specifics) and strictly (a batch
that remembers none, so the text alone must state them).

Not part of the product or of CI: run it with the commands in the README.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from core.adapters.llm.openai_compat import build_messages
from core.domain.calibration import request_chars
from core.domain.compaction import CompactionPlan, StoredBatch, SummaryBatch
from core.domain.gate import GateInput, GateVerdict, Passed, check_compaction
from core.domain.messages import ConversationMessage
from core.domain.prompts import build_summarization_request
from core.domain.specifics import apply_ledger, rank_specifics
from core.domain.tokens import DEFAULT_COUNTER
from core.domain.usage import LlmUsage
from devtools.real_model.conversations import Case, cases

MAX_SUMMARY_TOKENS = 1024  # [compaction].max_summary_tokens's default
SPECIFICS_RATIO = 0.25  # [compaction].specifics_ratio's default
HERE = Path(__file__).resolve().parent


def request_of(case: Case) -> dict[str, Any]:
    """The request as the OpenAI adapter sends it, with what the turns say plainly."""
    request = build_summarization_request(
        system_prompt=None,
        previous_summary=case.previous_summary,
        messages=case.turns,
        model_name="smollm2-135m-instruct",
        max_tokens=MAX_SUMMARY_TOKENS,
    )
    plain = "\n".join(m.content for m in case.turns if m.content)
    return {
        "name": case.name,
        "messages": build_messages(request),
        "max_tokens": request.max_tokens,
        "plain_text": plain,
        "request_chars": request_chars(request),
        "plain_chars": len(plain),
    }


def _plan(case: Case, batch: SummaryBatch) -> CompactionPlan:
    stored = StoredBatch(
        id=f"{case.name}:0",
        label=f"compaction-batch-{case.name}-0",
        conversation_id=case.name,
        batch=batch,
        compaction_id=case.name,
    )
    return CompactionPlan(
        compaction_id=case.name,
        conversation_id=case.name,
        new_batches=(stored,),
        deleted_message_ids=tuple(m.id for m in case.turns),
        clip_archive=None,
        messages_compressed=len(case.turns),
        tokens_estimate_before=1000,
        tokens_estimate_after=100,
        usage=LlmUsage(summarizer="openai", model="smollm2-135m-instruct"),
    )


def _batch(turns: tuple[ConversationMessage, ...], content: str) -> SummaryBatch:
    return SummaryBatch(
        content=content,
        depth=0,
        start_time=turns[0].created_at,
        end_time=turns[-1].created_at,
        message_count=len(turns),
        source_message_ids=tuple(m.id for m in turns),
    )


def gate_verdicts(case: Case, answer: str) -> tuple[GateVerdict | str, GateVerdict | str]:
    """(as the pipeline applies it, strict) for the model's ``answer``; the
    summariser refuses an empty answer before any gate (``ModelResponseError``)."""
    text = answer.strip()
    if not text:
        return "refused by the summariser: empty", "refused by the summariser: empty"
    allowance = int(MAX_SUMMARY_TOKENS * SPECIFICS_RATIO)
    ledger = apply_ledger(text, rank_specifics(case.turns), allowance, DEFAULT_COUNTER.count)
    applied = _batch(case.turns, ledger.content).model_copy(
        update={"specifics": ledger.remembered, "ledger": ledger.shown}
    )
    strict = _batch(case.turns, text)
    return (
        check_compaction(GateInput(_plan(case, applied), case.turns)),
        check_compaction(GateInput(_plan(case, strict), case.turns)),
    )


def _verdict_text(verdict: GateVerdict | str) -> str:
    if isinstance(verdict, str):
        return verdict
    if isinstance(verdict, Passed):
        return "passed"
    return f"rejected: {verdict.reason} ({verdict.detail})"


def _complete(requests: list[dict[str, Any]], workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "requests.json"
    path.write_text(json.dumps(requests, indent=1))
    done = subprocess.run(
        ["node", str(HERE / "complete.mjs"), str(path)],
        check=True,
        capture_output=True,
        text=True,
    )
    answers: list[dict[str, Any]] = json.loads(done.stdout)
    return answers


def report(case: Case, request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    applied, strict = gate_verdicts(case, answer["text"])
    return {
        **answer,
        "request_chars": request["request_chars"],
        "request_chars_over_4": -(-request["request_chars"] // 4),
        "plain_chars": request["plain_chars"],
        "gate_as_applied": _verdict_text(applied),
        "gate_strict": _verdict_text(strict),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/real-model"))
    parser.add_argument("--answers", type=Path, help="gate these answers instead of asking")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    chosen = cases()
    requests = [request_of(case) for case in chosen]
    if args.answers:
        answers = json.loads(args.answers.read_text())
    else:
        answers = _complete(requests, args.workdir)
        (args.workdir / "answers.json").write_text(json.dumps(answers, indent=1))
    results = [report(c, r, a) for c, r, a in zip(chosen, requests, answers, strict=True)]
    (args.workdir / "report.json").write_text(json.dumps(results, indent=1))
    json.dump(results, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
