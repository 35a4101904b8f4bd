"""Generated conversations with planted specifics of every kind the ledger knows.

Shared by the ledger's tests and ``bench/specifics_bench.py``: turns of filler
(chatter, acknowledgements, tool noise) among which some turns state one
specific (an amount, a date, a URL, an e-mail address, a file path, a ticket,
order, commit or version id, a code symbol, a quoted string, a name) in the
middle of a sentence, where a summary that keeps each turn's gist loses it.
Seeded: the same seed gives the same conversation.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from core.domain.messages import ConversationMessage, Role

T0 = datetime(2026, 2, 2, 9, 0, tzinfo=UTC)
KINDS = (
    "amount",
    "datetime",
    "url",
    "email",
    "path",
    "identifier",
    "symbol",
    "quote",
    "name",
)
_WORDS = (
    "invoice ledger harbor falcon meadow quartz signal ember willow cobalt lantern orbit "
    "prairie summit thistle velvet beacon canyon maple tundra"
).split()
_FIRST = "Margarethe Oskar Ingrid Tobias Leontine Ferdinand Anouk Casimir Rosalind Evander".split()
_LAST = "Okonkwo Lindqvist Bergamo Haverkamp Delacroix Nakashima Ferreira Vasquez".split()
_FILLER = (
    "ok, that makes sense to me",
    "let me think about it for a moment and come back to this",
    "thanks, I noted that down and will keep it in mind",
    "the weather has been grey all week, we mostly stayed inside",
    "sounds good, we can go on with the plan as discussed",
    "I am still reading through the rest of the thread",
    "sure, no problem at all, happy to help with that",
    "that was a long meeting but we got through the agenda",
)
_LEADS = (
    "after going back and forth with the team yesterday we settled on",
    "for the record, and so nobody has to ask again later, it is",
    "I double checked it in the other system and the value there is",
    "the thing you asked about earlier turned out to be",
    "once the review was done everyone agreed to go with",
)


def planted_value(kind: str, rng: random.Random) -> str:
    """One specific of ``kind``, written as people write them."""
    word = rng.choice(_WORDS)
    n = rng.randint(100, 99_999)
    values = {
        "amount": rng.choice(
            [f"${n:,}", f"{n} ms", f"{rng.randint(2, 900)} GB", f"€{n}.{rng.randint(10, 99)}"]
        ),
        "datetime": rng.choice(
            [
                f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                f"{rng.randint(0, 23):02d}:{rng.choice(['00', '15', '30', '45'])} UTC",
            ]
        ),
        "url": f"https://{word}.example.com/{rng.choice(_WORDS)}/{n}",
        "email": f"{rng.choice(_FIRST).lower()}.{word}@{rng.choice(_WORDS)}.io",
        "path": rng.choice(
            [f"/srv/{word}/{rng.choice(_WORDS)}_{n}.toml", f"src/{word}/{rng.choice(_WORDS)}.py"]
        ),
        "identifier": rng.choice(
            [
                f"{word[:4].upper()}-{n}",
                f"ORD-{n}",
                _commit(rng),
                f"v{rng.randint(1, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 9)}",
            ]
        ),
        "symbol": rng.choice(
            [f"{word}_{rng.choice(_WORDS)}()", f"{word}{rng.choice(_WORDS).title()}"]
        ),
        "quote": f'"{word} {rng.choice(_WORDS)} {rng.choice(_WORDS)}"',
        "name": f"{rng.choice(_FIRST)} {rng.choice(_LAST)}",
    }
    return values[kind]


def _commit(rng: random.Random) -> str:
    """Ten hex digits with a letter and a digit (what tells a commit from a number)."""
    digits = f"{rng.getrandbits(40):010x}"
    return "a" + digits[1:-1] + "7"


@dataclass(frozen=True)
class Planted:
    kind: str
    text: str  # as the clip-archive must show it (a quote without its quotes)
    message_id: str


@dataclass(frozen=True)
class PlantedConversation:
    messages: tuple[ConversationMessage, ...]
    planted: tuple[Planted, ...]


def planted_conversation(
    seed: int,
    turns: int,
    *,
    conversation_id: str = "planted",
    start: int = 0,
    every: int = 3,
    filler_sentences: int = 2,
) -> PlantedConversation:
    """``turns`` turns, one in ``every`` stating a specific (kinds in turn), the
    rest filler; message ids ``p{start + i}``."""
    rng = random.Random(seed * 7919 + start)
    messages: list[ConversationMessage] = []
    planted: list[Planted] = []
    roles: tuple[Role, ...] = ("user", "assistant", "user", "assistant", "tool")
    for i in range(start, start + turns):
        role = roles[i % len(roles)]
        filler = [rng.choice(_FILLER) for _ in range(filler_sentences)]
        message_id = f"p{i:05d}"
        if i % every == 0:
            kind = KINDS[(i // every) % len(KINDS)]
            value = planted_value(kind, rng)
            sentence = f"{rng.choice(_LEADS)} {value} and {rng.choice(_FILLER)}"
            filler.insert(rng.randint(0, len(filler)), sentence)
            shown = value.strip('"') if kind == "quote" else value
            planted.append(Planted(kind, shown, message_id))
        content = ". ".join(s[0].upper() + s[1:] for s in filler) + "."
        messages.append(
            ConversationMessage(
                id=message_id,
                conversation_id=conversation_id,
                role=role,
                content=content,
                created_at=T0 + timedelta(minutes=i),
            )
        )
    return PlantedConversation(tuple(messages), tuple(planted))
