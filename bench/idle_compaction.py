"""Compact while the conversation pauses ([budget].idle_seconds, issue 18 part 6).

A paced replay with pauses, in simulated time, through the worker's own rules
(``core.domain.tally``: ``on_message``, ``on_completion``,
``reconcile_due`` / ``on_reconcile`` on the reconciliation timer's interval):
``--conversations`` conversations, each a series of exchanges of 2–6
messages a few seconds apart, separated by pauses of 20–120 s (a person
reading, thinking, away). A compaction takes ``--compaction-seconds`` from
its command to its completion and leaves the history at the target plus
whatever arrived meanwhile (messages after the command's cut are never
touched). Run twice on the same replay:

* ``compact_at`` alone: a compaction starts when a message crosses the trigger;
* ``compact_at`` + ``idle_seconds``: between the trigger and the budget, a
  compaction starts once the conversation has had no message for
  ``idle_seconds`` (noticed by the reconciliation timer); over the budget at once.

Reported: the share of compactions done while idle (no message arrived
between the command and the completion: nobody was mid-exchange), and
conversation-seconds over the budget (summed over conversations; the budget is
what a reader must never see exceeded).

    python -m bench.idle_compaction [--conversations 500] [--idle-seconds 10]
    python -m bench.idle_compaction --quick
"""

from __future__ import annotations

import argparse
import heapq
import random
from dataclasses import dataclass, field

from core.domain.budget import BudgetConfig
from core.domain.tally import (
    Completion,
    ConversationTally,
    on_completion,
    on_message,
    on_reconcile,
    reconcile_due,
)


@dataclass
class Outcome:
    compactions: int = 0
    while_idle: int = 0
    seconds_over: float = 0.0
    conversation_seconds: float = 0.0


@dataclass(order=True)
class _Event:
    at: float
    order: int
    kind: str = field(compare=False)
    conversation: int = field(compare=False)
    tokens: int = field(compare=False, default=0)


def replay(conversations: int, hours: float, seed: int) -> list[list[tuple[float, int]]]:
    """Per conversation: (time, tokens) of each message."""
    rng = random.Random(seed)
    out = []
    for _ in range(conversations):
        t = rng.uniform(0, 60)
        messages = []
        while t < hours * 3600:
            for _ in range(rng.randint(2, 6)):
                messages.append((t, rng.randint(60, 220)))
                t += rng.uniform(2, 8)
            t += rng.uniform(20, 120)
        out.append(messages)
    return out


def simulate(
    messages: list[list[tuple[float, int]]],
    budget: BudgetConfig,
    compaction_seconds: float,
    reconcile_every: float,
    command_timeout: float = 30.0,
) -> Outcome:
    events: list[_Event] = []
    order = 0

    def push(at: float, kind: str, conversation: int, tokens: int = 0) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, _Event(at, order, kind, conversation, tokens))

    end = max(t for convo in messages for t, _ in convo) + 300
    for c, convo in enumerate(messages):
        for t, tokens in convo:
            push(t, "message", c, tokens)
    t = 0.0
    while t < end:
        push(t, "reconcile", -1)
        t += reconcile_every
    tallies = [ConversationTally(conversation_id=f"c{c}") for c in range(len(messages))]
    arrived_during: dict[int, int] = {}  # tokens that arrived while a compaction ran
    last_change = [0.0] * len(messages)
    outcome = Outcome()

    def account_over(c: int, now: float) -> None:
        if tallies[c].token_total > budget.budget_tokens:
            outcome.seconds_over += now - last_change[c]
        last_change[c] = now

    def issue(c: int, now: float) -> None:
        arrived_during[c] = 0
        push(now + compaction_seconds, "done", c)

    while events:
        event = heapq.heappop(events)
        c, now = event.conversation, event.at
        if event.kind == "message":
            account_over(c, now)
            tallies[c], send = on_message(tallies[c], event.tokens, budget, now)
            if c in arrived_during:
                arrived_during[c] += event.tokens
            if send:
                issue(c, now)
        elif event.kind == "done":
            account_over(c, now)
            during = arrived_during.pop(c)
            outcome.compactions += 1
            outcome.while_idle += during == 0
            before = tallies[c].token_total
            after = min(before, budget.target_tokens + during)
            completion = Completion(
                compaction_id=tallies[c].outstanding or "",
                status="compacted",
                messages_compressed=1,
                tokens_removed=before - after,
                tokens_added=0,
            )
            tallies[c], send = on_completion(tallies[c], completion, budget, now)
            if send:
                issue(c, now)
        else:
            for c2, tally in enumerate(tallies):
                if c2 not in arrived_during and reconcile_due(tally, budget, now, command_timeout):
                    tallies[c2], send = on_reconcile(tally, budget, now, command_timeout)
                    if send:
                        issue(c2, now)
    for c in range(len(messages)):
        account_over(c, end)
    outcome.conversation_seconds = end * len(messages)
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=500)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--budget-tokens", type=int, default=4000)
    parser.add_argument("--compact-at", type=float, default=0.85)
    parser.add_argument("--target-ratio", type=float, default=0.6)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--compaction-seconds", type=float, default=3.0)
    parser.add_argument("--reconcile-seconds", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="50 conversations for 10 minutes")
    args = parser.parse_args()
    if args.quick:
        args.conversations, args.hours = 50, 1 / 6
    plain = BudgetConfig(
        context_budget=0.5,
        model_max_tokens=args.budget_tokens * 2,
        target_ratio=args.target_ratio,
        compact_at=args.compact_at,
    )
    idle = plain.model_copy(update={"idle_seconds": args.idle_seconds})
    messages = replay(args.conversations, args.hours, args.seed)
    print("# Compact while the conversation pauses (bench/idle_compaction.py)")
    print(
        f"{args.conversations} conversations for {args.hours} h (exchanges of 2–6 messages "
        f"2–8 s apart, pauses of 20–120 s), budget {plain.budget_tokens} tokens, trigger "
        f"{plain.trigger_tokens}, target {plain.target_tokens}; a compaction takes "
        f"{args.compaction_seconds} s; reconciliation every {args.reconcile_seconds} s\n"
    )
    print("| trigger | compactions | done while idle | conversation-seconds over budget |")
    print("| --- | --- | --- | --- |")
    for name, budget in (
        (f"compact_at {args.compact_at}", plain),
        (f"compact_at {args.compact_at} + idle_seconds {args.idle_seconds:g}", idle),
    ):
        out = simulate(messages, budget, args.compaction_seconds, args.reconcile_seconds)
        share = out.while_idle / max(1, out.compactions)
        over = out.seconds_over / out.conversation_seconds
        print(
            f"| {name} | {out.compactions} | {share:.1%} | "
            f"{out.seconds_over:,.0f} s ({over:.3%} of all) |"
        )


if __name__ == "__main__":
    main()
