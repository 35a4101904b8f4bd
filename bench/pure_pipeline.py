"""How the pure pipeline scales: score + split + chunk + build requests + clip-archive.

Prints absolute times and, because these machines are noisy, each size's
time per message relative to the smallest size measured in the same run.
A ratio near 1.0 means linear growth; the sort makes n·log n the floor.

    python -m bench.pure_pipeline [--repeat 5]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from datetime import UTC, datetime, timedelta

from core.domain.chunking import chunk_messages, in_history_order
from core.domain.clip_archive import build_clip_archive, parse_clip_archive
from core.domain.compaction import CompactionConfig, SummaryBatch
from core.domain.messages import ConversationMessage, ToolCall
from core.domain.prompts import build_summarization_request
from core.domain.split import split_history
from core.domain.tokens import estimate_history_tokens

T0 = datetime(2026, 1, 1, tzinfo=UTC)
WORDS = "the deploy failed because the payments config had an error so we agreed to fix the timeout".split()


def make_history(n: int) -> list[ConversationMessage]:
    out = []
    for i in range(n):
        role = ("user", "assistant", "assistant", "tool")[i % 4]
        text = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(8 + i % 40))
        calls = (
            (ToolCall(id=f"c{i}", name="run", arguments={"i": i}),)
            if role == "assistant" and i % 8 == 2
            else None
        )
        out.append(
            ConversationMessage(
                id=f"m{i}",
                conversation_id="bench",
                role=role,
                content=text + ("?" if i % 5 == 0 else ""),
                tool_calls=calls,
                tool_call_id=f"c{i - 1}" if role == "tool" and i % 8 == 3 else None,
                created_at=T0 + timedelta(seconds=i),
            )
        )
    return out


def pipeline(history: list[ConversationMessage], config: CompactionConfig) -> int:
    estimate_history_tokens(history)
    split = split_history(history, config.keep_recent, config.scoring)
    position = {m.id: i for i, m in enumerate(history)}
    chunks = chunk_messages(split.to_compress, config.chunk_size, config.max_chunk_tokens)
    batches = []
    running = None
    for chunk in chunks:
        ordered = in_history_order(chunk, position)
        request = build_summarization_request(
            system_prompt=config.prompt,
            previous_summary=running,
            messages=ordered,
            model_name="bench",
            max_tokens=config.max_summary_tokens,
        )
        running = f"summary of {len(request.messages)} messages"
        batches.append(
            SummaryBatch(
                content=running,
                depth=0,
                start_time=min(m.created_at for m in ordered),
                end_time=max(m.created_at for m in ordered),
                message_count=len(ordered),
            )
        )
    text = build_clip_archive(
        batches,
        clip_first=config.clip_first,
        clip_last=config.clip_last,
        messages_compressed=len(split.to_compress),
        cycles=1,
    )
    parse_clip_archive(text)
    return len(batches)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1_000, 10_000])
    args = parser.parse_args()
    config = CompactionConfig()
    print(f"python {platform.python_version()} on {platform.machine()}, best of {args.repeat}")
    print(
        f"{'messages':>9} {'batches':>8} {'median ms':>10} {'best ms':>9} {'µs/msg':>8} {'vs smallest':>12}"
    )
    baseline: float | None = None
    for n in args.sizes:
        history = make_history(n)
        pipeline(history, config)  # warm-up
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            batches = pipeline(history, config)
            times.append(time.perf_counter() - start)
        best = min(times)
        per_message = best / n
        baseline = baseline or per_message
        print(
            f"{n:>9} {batches:>8} {statistics.median(times) * 1e3:>10.2f} {best * 1e3:>9.2f}"
            f" {per_message * 1e6:>8.2f} {per_message / baseline:>11.2f}x"
        )


if __name__ == "__main__":
    main()
