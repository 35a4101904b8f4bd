"""The turn-time contract, end to end: a real worker, Kafka, PostgreSQL and a slow
LLM stand-in; a platform that reads the context at every turn.

* A burst of 300 turns into each of three conversations while a reader polls
  ``/context`` every 50 ms: the stored history goes several times over the
  window until the LLM compactions land, yet no answer is over the budget (the
  default fit), the answers meanwhile say they are provisional, and the LLM's
  clip-archive replaces the provisional one. The final contexts go through the
  real ``openai`` and ``anthropic`` SDKs.
* Read-your-writes under load: each message published is in the context read
  right after the producer's ack, by id (``through``) and by position
  (``after``), never an older context.
* A provider outage: every context still fits, provisional, until the provider
  is back and the compactions land.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import anthropic
import openai
import pytest

from tests.e2e.conftest import BUDGET_TOKENS, Conversation, Stack, eventually, ready_worker
from tests.support.llm_server import OPENAI_CHAT_PATH, ServerError

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

WINDOW = 2 * BUDGET_TOKENS  # model_max_tokens of the stack's [budget]
# One chunk per compaction of a burst, so a 2 s provider compacts it in seconds;
# the rate limits are the defaults: a reader at every turn is not throttled.
CONFIG = {"summarization": {"chunk_size": 100, "timeout_seconds": 10.0}}


async def started(stack: Stack) -> Any:
    return await ready_worker(stack, CONFIG)


def estimated(request: dict[str, Any]) -> int:
    """Tokens of an OpenAI-shaped context, counted here, not taken from the worker."""
    return sum(math.ceil(len(m.get("content") or "") / 4) for m in request["messages"])


class Reader:
    """A platform polling the context of its conversations every 50 ms."""

    def __init__(self, stack: Stack, ids: list[str]) -> None:
        self.stack, self.ids = stack, ids
        self.answers: list[dict[str, Any]] = []
        self.stored_peak = 0

    async def poll(self, until: asyncio.Event) -> None:
        worker = self.stack.workers[0]
        while not until.is_set():
            for cid in self.ids:
                status, body = await worker.get(f"/conversations/{cid}/context?format=openai")
                if status == 404:
                    continue  # no message stored yet
                assert status == 200, (status, body)
                self.answers.append(body)
                self.stored_peak = max(self.stored_peak, body["stored_tokens"])
            await asyncio.sleep(0.05)


async def settled(stack: Stack, cid: str, last: str | None = None) -> dict[str, Any]:
    """Compacted by the LLM, through ``last`` (every message sent is stored: ingest
    may lag the producer's acks, and a history compacted halfway is not settled)."""
    through = f"&through={last}" if last else ""
    status, body = await stack.workers[0].get(
        f"/conversations/{cid}/context?format=openai{through}"
    )
    assert status == 200, body
    assert not body["provisional"], f"{cid}: still provisional ({body['stored_tokens']} stored)"
    assert body["stored_tokens"] <= BUDGET_TOKENS, body["stored_tokens"]
    return body


async def test_a_burst_never_hands_out_more_than_the_budget(stack: Stack) -> None:
    stack.llm.latency_seconds = 2.0  # a provider answering like a real one
    await started(stack)
    conversations = [Conversation(f"burst-{n}", marker, chars=80) for n, marker in
                     enumerate(("orchid", "falcon", "glacier"))]  # fmt: skip
    reader = Reader(stack, [c.id for c in conversations])
    done = asyncio.Event()
    polling = asyncio.create_task(reader.poll(done))
    await stack.send_all(e for _ in range(300) for c in conversations for e in [c.message()])
    for conversation in conversations:
        last = conversation.events[-1]["message_id"]
        await eventually(lambda c=conversation, m=last: settled(stack, c.id, m), timeout=180,
                         what=f"{conversation.id} compacted by the LLM")  # fmt: skip
    done.set()
    await polling
    assert reader.stored_peak > BUDGET_TOKENS, "the burst never went over the budget"
    assert any(a["provisional"] for a in reader.answers), "no answer was fitted"
    for answer in reader.answers:
        assert answer["token_estimate"] <= BUDGET_TOKENS, answer["token_estimate"]
        assert estimated(answer["request"]) <= BUDGET_TOKENS
    for conversation in conversations:
        final = await settled(stack, conversation.id)
        first = final["request"]["messages"][0]
        assert first["role"] == "system" and "Summary: discussed" in first["content"]
        assert "[Provisional summary" not in json.dumps(final)
        await through_the_sdks(stack, conversation.id)


async def through_the_sdks(stack: Stack, cid: str) -> None:
    """The worker's answers, as they are, accepted by the real SDKs."""
    worker = stack.workers[0]
    _, shaped = await worker.get(f"/conversations/{cid}/context?format=openai")
    client = openai.AsyncOpenAI(api_key="k", base_url=stack.llm.openai_base_url, max_retries=0)
    async with client:
        await client.chat.completions.create(model="m", max_tokens=32, **shaped["request"])
    _, shaped = await worker.get(f"/conversations/{cid}/context?format=anthropic")
    request = {k: v for k, v in shaped["request"].items() if v is not None}
    client_a = anthropic.AsyncAnthropic(api_key="k", base_url=stack.llm.base_url, max_retries=0)
    async with client_a:
        await client_a.messages.create(model="m", max_tokens=32, **request)


async def test_a_message_is_in_the_context_read_right_after_its_ack(stack: Stack) -> None:
    worker = await started(stack)
    background = [Conversation(f"noise-{n}", "meadow", chars=120) for n in range(20)]
    stop = asyncio.Event()

    async def traffic() -> None:  # about 200 events/s into other conversations
        while not stop.is_set():
            await stack.send_all(c.message() for c in background)
            await asyncio.sleep(0.1)

    noise = asyncio.create_task(traffic())
    platform = Conversation("platform-1", "quartz", chars=120)
    waited = []
    try:
        for n in range(30):
            event = platform.message()
            sent = await stack.send(event)
            asked_at = time.monotonic()
            by = (("through", event["message_id"]) if n % 2 else
                  ("after", f"{sent.partition}:{sent.offset}"))  # fmt: skip
            status, body = await worker.get(
                f"/conversations/{platform.id}/context?{by[0]}={by[1]}&wait_ms=5000"
            )
            waited.append(time.monotonic() - asked_at)
            assert status == 200, (n, status, body)
            ids = [m["id"] for m in body["request"]["messages"]]
            assert event["message_id"] in ids, (n, ids[-3:])
            assert body["watermark"]["offset"] >= sent.offset
    finally:
        stop.set()
        await noise
    print("publish-to-readable waits (s):", sorted(round(w, 3) for w in waited))
    status, body = await worker.get(
        f"/conversations/{platform.id}/context?through=never-sent&wait_ms=200"
    )
    assert status == 409 and "not stored yet" in body["error"]


async def test_in_a_provider_outage_every_context_still_fits(stack: Stack) -> None:
    stack.llm.enqueue(*[ServerError(503)] * 10_000, path=OPENAI_CHAT_PATH)
    worker = await started(stack)
    conversation = Conversation("outage-1", "saffron", chars=120)
    await stack.send_all(conversation.message() for _ in range(120))  # ~3,600 tokens

    async def provisional() -> dict[str, Any]:
        status, body = await worker.get(f"/conversations/{conversation.id}/context?format=openai")
        assert status == 200 and body["stored_tokens"] > WINDOW, body.get("stored_tokens")
        return dict(body)

    body = await eventually(provisional, timeout=60, what="every message stored")
    assert body["provisional"] and body["token_estimate"] <= BUDGET_TOKENS
    window = (await worker.get(f"/conversations/{conversation.id}/context?fit=window"))[1]
    assert BUDGET_TOKENS < window["token_estimate"] <= WINDOW
    stack.llm.reset()
    last = conversation.events[-1]["message_id"]
    await eventually(lambda: settled(stack, conversation.id, last), timeout=120,
                     what="compacted once the provider is back")  # fmt: skip
