"""A local stand-in for LLM and embedding APIs, speaking their real wire formats.

Why a server rather than mocks: the adapters' value lies in what the real
``anthropic`` and ``openai`` SDKs put on the wire and how they react to what
comes back (status codes, headers, broken bodies, slow replies). Only a real
HTTP peer exercises that, and the same peer serves benchmarks and end-to-end
runs of a separate worker process, where patching is impossible.

Endpoints (all under ``base_url``):

* ``POST /v1/messages``: Anthropic Messages API (non-streaming).
* ``POST /v1/chat/completions``: OpenAI Chat Completions (non-streaming).
* ``POST /v1/embeddings``: OpenAI embeddings, deterministic hashed
  bag-of-words vectors so that texts sharing words get similar vectors.
* ``/_test/...``: control endpoints so a test can script a server running in
  another process (see ``action_from_json``).

In-process::

    async with LLMTestServer() as server:
        provider = AnthropicProvider("key", base_url=server.base_url)
        server.enqueue(RateLimited(retry_after=1.5))

Standalone (prints the bound URL, runs until SIGTERM or SIGINT)::

    python -m tests.support.llm_server --port 0 --latency-ms 500
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import itertools
import json
import math
import re
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import TracebackType
from typing import Any, Literal, Self

from aiohttp import web

from core.domain.gate import COMMON_WORDS, CONTENT_WORD

Protocol = Literal["anthropic", "openai"]

ANTHROPIC_PATH = "/v1/messages"
#: The Messages API caches no prefix shorter than this (the documented minimum of
#: most models; some want 2,048 or 4,096), and keeps one warm for five minutes.
ANTHROPIC_MIN_CACHEABLE_TOKENS = 1024
ANTHROPIC_CACHE_TTL_SECONDS = 300.0
USAGE_KINDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "calls")
OPENAI_CHAT_PATH = "/v1/chat/completions"
EMBEDDINGS_PATH = "/v1/embeddings"


# --------------------------------------------------------------------------
# Scripted actions: each is consumed by exactly one request.
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """Answer normally; ``None`` fields fall back to the default responder and
    the tokenizer stand-in's usage (``request_tokens``), so a test pins only what
    it asserts on."""

    text: str | None = None
    stop_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True)
class RateLimited:
    """429 with a provider-shaped error body; ``retry_after=None`` sends no
    ``retry-after`` header, to test the absence of a hint."""

    retry_after: float | None = 1.0


@dataclass(frozen=True)
class ServerError:
    status: int = 500


@dataclass(frozen=True)
class Overloaded:
    """Anthropic's 529 ``overloaded_error``; sent as-is on every path."""


@dataclass(frozen=True)
class HTTPError:
    """Any other error status (401, 403, 400, 404...), provider-shaped."""

    status: int
    message: str = "scripted error"
    code: str | None = None


@dataclass(frozen=True)
class Delay:
    """Wait, then perform ``then``; long enough a wait trips client timeouts."""

    seconds: float
    then: Action | None = None


@dataclass(frozen=True)
class Malformed:
    """A 200 the client cannot use: by default it claims JSON but is not;
    ``content_type="text/html"`` imitates a proxy's error page, and a body
    like ``"{}"`` is valid JSON of the wrong shape."""

    body: str = '{"id": "msg_broken", "content": [ {"type": "te'
    content_type: str = "application/json"


Action = Reply | RateLimited | ServerError | Overloaded | HTTPError | Delay | Malformed


@dataclass(frozen=True)
class ChatRequest:
    """A chat request from either protocol, flattened so one responder serves
    both; ``body`` keeps the raw JSON for anything protocol-specific."""

    protocol: Protocol
    model: str
    system: str | None
    messages: tuple[tuple[str, str], ...]
    max_tokens: int | None
    body: Mapping[str, Any]


Responder = Callable[[ChatRequest], str]


@dataclass(frozen=True)
class RecordedRequest:
    """What arrived, exactly: tests assert on this rather than on adapter
    internals. ``body`` is ``None`` when the request body was not JSON."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    received_at: float = field(default_factory=time.monotonic)


def turn_words(request: ChatRequest, count: int = 24) -> str:
    """A few words of the request's turns (``words_of_turns``)."""
    return words_of_turns(request.messages, count)


def model_turn_words(request: Any, count: int = 24) -> str:
    """``words_of_turns`` of a port ``ModelRequest`` (for in-process model fakes)."""
    return words_of_turns([(m.role, m.content) for m in request.messages], count)


def words_of_turns(messages: Sequence[tuple[str, str]], count: int = 24) -> str:
    """The first content word of each of a request's turns (words as the gate
    reads them, not the commonest), at most ``count``. A stand-in whose summary is
    otherwise fixed carries them, so it says something of its turns: the gate
    refuses a summary sharing no word with them (``core.domain.gate``)."""
    words: list[str] = []
    for role, text in messages[:-1]:  # the last one is the directive
        if role == "system":
            continue
        for word in CONTENT_WORD.findall(_unfenced_lines(text[:4000])[:2000].casefold()):
            if word not in _NOT_TURN_WORDS and word not in words:
                words.append(word)
                break
    return " ".join(words[:count])


def _unfenced_lines(text: str) -> str:
    """The text without fence markers and without its ``[Tool call]`` label."""
    lines = (line for line in text.splitlines() if "conversation-data" not in line)
    return re.sub(r"^\[[A-Za-z ]+\]:?\s*", "", "\n".join(lines))


_NOT_TURN_WORDS = COMMON_WORDS | {"user", "assistant", "tool", "system", "summary", "previous"}


def prose(chars: int, about: str = "") -> str:
    """About ``chars`` characters of summary-like prose that never loops (each
    sentence numbered: the gate refuses a summary repeating its own words to its
    end), opening with ``about`` (kept whole, however short ``chars``)."""
    sentences = (f"Note {i}: the payments deploy moved to tuesday." for i in range(10**6))
    text = f"{about}. " if about else ""
    keep = len(text)
    while len(text) < chars:
        text += next(sentences) + " "
    return text[: max(chars, keep)].strip()


def summary_responder(request: ChatRequest) -> str:
    """Deterministic, summary-shaped output: stable across runs and visibly
    derived from the input, so callers can check what reached the model."""
    parts = [" ".join(content.split()[:6]) for _, content in request.messages]
    return "Summary: " + " | ".join(p for p in parts if p)


def gist_responder(request: ChatRequest) -> str:
    """``summary_responder`` without the fence markers and the directive: the
    first six words of each turn, as a summary keeps a turn's gist and drops its
    particulars, in a shape the gate passes (it refuses the fence markers)."""
    parts = [
        " ".join(_unfenced_lines(content).split()[:6])
        for role, content in request.messages[:-1]
        if role != "system"
    ]
    return "Summary: " + " | ".join(p for p in parts if p)


def model_like_responder(request: ChatRequest) -> str:
    """What a model's summary looks like to the gate, for benchmarks: about a
    fifth of its turns' characters (200 to 1,200), naming words of its turns,
    in sentences that never loop. ``summary_responder`` quotes each message's
    first words, the fence markers included, so the gate refuses every one of
    its summaries (``echo``) and a benchmark measured the extractive fallback."""
    turns = [c for role, c in request.messages[:-1] if role != "system"]
    size = min(1200, max(200, sum(len(c) for c in turns) // 5))
    return prose(size, about=f"The conversation covered {turn_words(request)}")


# --------------------------------------------------------------------------
# Embeddings
# --------------------------------------------------------------------------

_WORD = re.compile(r"\w+")


def hashed_embedding(text: str, dim: int) -> list[float]:
    """Unit-length signed feature hashing of lower-cased words: no model to
    download, identical on every machine, and texts sharing words point the
    same way. Text without words maps to the first basis vector, so no vector
    is ever zero (cosine similarity stays defined)."""
    vector = [0.0] * dim
    for word in _WORD.findall(text.lower()):
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        bucket = int.from_bytes(digest[:4], "little") % dim
        vector[bucket] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    if norm == 0.0:
        vector[0] = 1.0
        return vector
    return [x / norm for x in vector]


# --------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------


class _BadRequest(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class LLMTestServer:
    """Serves the three endpoints on 127.0.0.1 (never another interface).

    ``latency_seconds`` delays every reply, for benchmarks that need a
    realistic model round trip. ``api_key``, when set, is enforced as a
    bearer token (or, for Anthropic, ``x-api-key``), answering 401 otherwise.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        latency_seconds: float = 0.0,
        responder: Responder = summary_responder,
        embedding_dim: int = 64,
        api_key: str | None = None,
        cache_min_tokens: int = ANTHROPIC_MIN_CACHEABLE_TOKENS,
    ) -> None:
        self.latency_seconds = latency_seconds
        # Prompt caching as the Messages API does it: a prefix up to a block marked
        # cache_control, of at least cache_min_tokens, is written on first use and
        # read while it is warm (tokens: ``stand_in_tokens``, as everywhere here).
        self.cache_min_tokens = cache_min_tokens
        self.cache_ttl_seconds = ANTHROPIC_CACHE_TTL_SECONDS
        self._cache: dict[str, float] = {}
        # What the chat endpoints answered, summed: what a bill would count.
        self.usage_totals: dict[str, int] = dict.fromkeys(USAGE_KINDS, 0)
        self.responder = responder
        self.embedding_dim = embedding_dim
        self.api_key = api_key
        self.requests: list[RecordedRequest] = []
        # What a request gets when nothing scripted is waiting for it (by
        # path): a failure here makes an outage that lasts as long as a test
        # wants, instead of one scripted action per request.
        self.default_action: Callable[[str], Action] | None = None
        # Chat requests being answered now, and the most there ever were at
        # once: what a client-side concurrency limit looks like from here.
        self.chat_in_flight = 0
        self.peak_chat_in_flight = 0
        self._port = port
        self._script: list[tuple[str | None, Action]] = []
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._bound_port: int | None = None

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        # A provider takes requests far over aiohttp's 1 MiB default (Anthropic's
        # limit is 32 MB): a compaction of turns of max_content_chars sends several MB.
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post(ANTHROPIC_PATH, self._handle_anthropic)
        app.router.add_post(OPENAI_CHAT_PATH, self._handle_openai_chat)
        app.router.add_post(EMBEDDINGS_PATH, self._handle_embeddings)
        app.router.add_post("/_test/enqueue", self._handle_control_enqueue)
        app.router.add_get("/_test/requests", self._handle_control_requests)
        app.router.add_post("/_test/reset", self._handle_control_reset)
        # Cancelling handlers whose client went away keeps a Delay that
        # outlived a client timeout from holding shutdown up.
        runner = web.AppRunner(
            app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None
        )
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self._port))
        site = web.SockSite(runner, sock)
        await site.start()
        self._bound_port = sock.getsockname()[1]
        self._runner = runner

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def port(self) -> int:
        if self._bound_port is None:
            raise RuntimeError("server not started")
        return self._bound_port

    @property
    def base_url(self) -> str:
        """Root URL: what the Anthropic SDK takes as ``base_url``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base_url(self) -> str:
        """What the OpenAI SDK takes as ``base_url`` (it appends paths to ``/v1``)."""
        return f"{self.base_url}/v1"

    # -- scripting ---------------------------------------------------------

    def enqueue(self, *actions: Action, path: str | None = None) -> None:
        """Queue one-shot actions, consumed first-in first-out. With ``path``,
        only a request to that path consumes them, so chat and embedding
        traffic can be scripted independently."""
        self._script.extend((path, action) for action in actions)

    def reset(self) -> None:
        self._script.clear()
        self.requests.clear()
        self._cache.clear()
        self.usage_totals = dict.fromkeys(USAGE_KINDS, 0)

    def _cache_use(self, body: Mapping[str, Any]) -> tuple[int, int]:
        """(tokens read from the cache, tokens written to it) for a Messages API
        body: the prefix through the last system block marked ``cache_control``
        (this server caches system blocks only, which is what the adapter marks),
        if it is long enough; warm for ``cache_ttl_seconds`` after each use."""
        blocks = body.get("system")
        if not isinstance(blocks, list):
            return 0, 0
        marked = [i for i, b in enumerate(blocks) if isinstance(b, dict) and b.get("cache_control")]
        if not marked:
            return 0, 0
        prefix = [str(b.get("text", "")) for b in blocks[: marked[-1] + 1] if isinstance(b, dict)]
        tokens = stand_in_tokens(*prefix)
        if tokens < self.cache_min_tokens:
            return 0, 0
        key = hashlib.sha256("\x00".join([str(body.get("model")), *prefix]).encode()).hexdigest()
        now = time.monotonic()
        warm = self._cache.get(key, 0.0) > now
        self._cache[key] = now + self.cache_ttl_seconds
        return (tokens, 0) if warm else (0, tokens)

    @property
    def pending(self) -> int:
        """Scripted actions not yet consumed."""
        return len(self._script)

    def requests_to(self, path: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == path]

    def _next_action(self, path: str) -> Action:
        for i, (only, action) in enumerate(self._script):
            if only is None or only == path:
                del self._script[i]
                return action
        return self.default_action(path) if self.default_action is not None else Reply()

    # -- handlers ----------------------------------------------------------

    async def _record(self, request: web.Request) -> RecordedRequest:
        raw = await request.read()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        recorded = RecordedRequest(
            method=request.method,
            path=request.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
        )
        self.requests.append(recorded)
        return recorded

    async def _handle_anthropic(self, request: web.Request) -> web.StreamResponse:
        recorded = await self._record(request)
        return await self._serve_chat("anthropic", recorded)

    async def _handle_openai_chat(self, request: web.Request) -> web.StreamResponse:
        recorded = await self._record(request)
        return await self._serve_chat("openai", recorded)

    async def _serve_chat(
        self, protocol: Protocol, recorded: RecordedRequest
    ) -> web.StreamResponse:
        self.chat_in_flight += 1
        self.peak_chat_in_flight = max(self.peak_chat_in_flight, self.chat_in_flight)
        try:
            return await self._answer_chat(protocol, recorded)
        finally:
            # Also when the client hung up first (handler cancellation).
            self.chat_in_flight -= 1

    async def _answer_chat(
        self, protocol: Protocol, recorded: RecordedRequest
    ) -> web.StreamResponse:
        if not self._authorised(protocol, recorded.headers):
            return _error_response(protocol, 401, "invalid x-api-key", None)
        try:
            chat = (
                _parse_anthropic(recorded.body)
                if protocol == "anthropic"
                else _parse_openai_chat(recorded.body)
            )
        except _BadRequest as exc:
            return _error_response(protocol, 400, exc.message, None)

        action = await self._settle(recorded.path)
        if not isinstance(action, Reply):
            return _scripted_failure(protocol, action)
        text = action.text if action.text is not None else self.responder(chat)
        input_tokens = (
            action.input_tokens if action.input_tokens is not None else request_tokens(chat)
        )
        output_tokens = (
            action.output_tokens if action.output_tokens is not None else stand_in_tokens(text)
        )
        cache_read, cache_write = self._cache_use(chat.body) if protocol == "anthropic" else (0, 0)
        input_tokens = max(0, input_tokens - cache_read - cache_write)
        for kind, tokens in zip(
            USAGE_KINDS[:4], (input_tokens, output_tokens, cache_read, cache_write), strict=True
        ):
            self.usage_totals[kind] += tokens
        self.usage_totals["calls"] += 1
        number = next(self._ids)
        if protocol == "anthropic":
            payload: dict[str, Any] = {
                "id": f"msg_test_{number:06d}",
                "type": "message",
                "role": "assistant",
                "content": [{"type": "text", "text": text}],
                "model": chat.model,
                "stop_reason": action.stop_reason or "end_turn",
                "stop_sequence": None,
                "usage": {
                    "input_tokens": input_tokens,
                    "output_tokens": output_tokens,
                    "cache_creation_input_tokens": cache_write,
                    "cache_read_input_tokens": cache_read,
                },
            }
            headers = {"request-id": f"req_test_{number:06d}"}
        else:
            payload = {
                "id": f"chatcmpl-test{number:06d}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": chat.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": None,
                        "finish_reason": action.stop_reason or "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": input_tokens,
                    "completion_tokens": output_tokens,
                    "total_tokens": input_tokens + output_tokens,
                },
            }
            headers = {"x-request-id": f"req_test_{number:06d}"}
        return web.json_response(payload, headers=headers)

    async def _handle_embeddings(self, request: web.Request) -> web.StreamResponse:
        recorded = await self._record(request)
        if not self._authorised("openai", recorded.headers):
            return _error_response("openai", 401, "Incorrect API key provided", None)
        body = recorded.body
        try:
            if not isinstance(body, dict):
                raise _BadRequest("request body must be a JSON object")
            model = _require_str(body, "model")
            raw_input = body.get("input")
            texts = [raw_input] if isinstance(raw_input, str) else raw_input
            if not isinstance(texts, list) or not texts:
                raise _BadRequest("'input' must be a string or a non-empty array of strings")
            if not all(isinstance(t, str) for t in texts):
                raise _BadRequest("only string inputs are supported by this test server")
            encoding = body.get("encoding_format", "float")
            if encoding not in ("float", "base64"):
                raise _BadRequest("'encoding_format' must be 'float' or 'base64'")
            dim = body.get("dimensions", self.embedding_dim)
            if not isinstance(dim, int) or dim < 1:
                raise _BadRequest("'dimensions' must be a positive integer")
        except _BadRequest as exc:
            return _error_response("openai", 400, exc.message, None)

        action = await self._settle(recorded.path)
        if not isinstance(action, Reply):
            return _scripted_failure("openai", action)
        data = []
        for index, text in enumerate(texts):
            vector = hashed_embedding(text, dim)
            encoded: list[float] | str = (
                vector
                if encoding == "float"
                else base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
            )
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = stand_in_tokens(*texts)
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def _settle(self, path: str) -> Action:
        """Apply latency and any scripted delays; return the action to perform."""
        action = self._next_action(path)
        if self.latency_seconds > 0:
            await asyncio.sleep(self.latency_seconds)
        while isinstance(action, Delay):
            await asyncio.sleep(action.seconds)
            action = action.then if action.then is not None else Reply()
        return action

    def _authorised(self, protocol: Protocol, headers: Mapping[str, str]) -> bool:
        if self.api_key is None:
            return True
        bearer = headers.get("authorization") == f"Bearer {self.api_key}"
        if protocol == "anthropic":
            # Current SDKs send the key as a bearer token; older ones, and
            # curl examples, use x-api-key. Either is a valid credential.
            return bearer or headers.get("x-api-key") == self.api_key
        return bearer

    # -- control endpoints (for a server in another process) ---------------

    async def _handle_control_enqueue(self, request: web.Request) -> web.StreamResponse:
        try:
            spec = await request.json()
            path = spec.pop("path", None) if isinstance(spec, dict) else None
            self.enqueue(action_from_json(spec), path=path)
        except (ValueError, TypeError, KeyError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"pending": self.pending})

    async def _handle_control_requests(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(
            [
                {"method": r.method, "path": r.path, "headers": dict(r.headers), "body": r.body}
                for r in self.requests
            ]
        )

    async def _handle_control_reset(self, request: web.Request) -> web.StreamResponse:
        self.reset()
        return web.json_response({"pending": 0})


def action_from_json(spec: Any) -> Action:
    """Build an action from ``{"action": "<kind>", ...fields}``, the form the
    ``/_test/enqueue`` endpoint takes. Kinds: ``reply``, ``rate_limited``,
    ``server_error``, ``overloaded``, ``http_error``, ``malformed`` and
    ``delay`` (whose optional ``then`` is itself such a spec)."""
    if not isinstance(spec, dict):
        raise TypeError("action spec must be a JSON object")
    fields = dict(spec)
    kind = fields.pop("action")
    if kind == "delay":
        then = fields.pop("then", None)
        return Delay(then=action_from_json(then) if then is not None else None, **fields)
    kinds: dict[str, type[Action]] = {
        "reply": Reply,
        "rate_limited": RateLimited,
        "server_error": ServerError,
        "overloaded": Overloaded,
        "http_error": HTTPError,
        "malformed": Malformed,
    }
    if kind not in kinds:
        raise ValueError(f"unknown action {kind!r}")
    return kinds[kind](**fields)


def action_to_json(action: Action) -> dict[str, Any]:
    """Inverse of ``action_from_json``, for scripting a server in another process."""
    names = {
        Reply: "reply",
        RateLimited: "rate_limited",
        ServerError: "server_error",
        Overloaded: "overloaded",
        HTTPError: "http_error",
        Malformed: "malformed",
        Delay: "delay",
    }
    if isinstance(action, Delay):
        then = action_to_json(action.then) if action.then is not None else None
        return {"action": "delay", "seconds": action.seconds, "then": then}
    return {"action": names[type(action)], **asdict(action)}


# --------------------------------------------------------------------------
# Request parsing and error shapes
# --------------------------------------------------------------------------


def _parse_anthropic(body: Any) -> ChatRequest:
    """Validate the way the Messages API does for the fields adapters send.

    ``role: "system"`` inside ``messages`` is rejected on purpose: the adapter
    must lift system text into the top-level ``system`` field, and a lenient
    server would hide a regression there.
    """
    if not isinstance(body, dict):
        raise _BadRequest("request body must be a JSON object")
    model = _require_str(body, "model")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
        raise _BadRequest("max_tokens: field required (non-negative integer)")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise _BadRequest("messages: at least one message is required")
    messages = []
    for i, message in enumerate(raw_messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise _BadRequest(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        messages.append((message["role"], _content_text(message.get("content"), f"messages.{i}")))
    if messages[0][0] != "user":
        raise _BadRequest("messages: first message must use the 'user' role")
    _check_anthropic_turns(raw_messages)
    raw_system = body.get("system")
    system = None if raw_system is None else _content_text(raw_system, "system")
    temperature = body.get("temperature")
    if temperature is not None and not (
        isinstance(temperature, int | float) and 0.0 <= temperature <= 1.0
    ):
        raise _BadRequest("temperature: must be between 0 and 1")
    return ChatRequest("anthropic", model, system, tuple(messages), max_tokens, body)


def _parse_openai_chat(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise _BadRequest("request body must be a JSON object")
    model = _require_str(body, "model")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise _BadRequest("'messages' must be a non-empty array")
    system_parts: list[str] = []
    messages = []
    for i, message in enumerate(raw_messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise _BadRequest(f"messages[{i}].role: invalid value {role!r}")
        text = _content_text(message.get("content") or "", f"messages[{i}]")
        if role in ("system", "developer"):
            system_parts.append(text)
        else:
            messages.append((role, text))
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise _BadRequest("'max_tokens' must be a positive integer")
    system = "\n\n".join(system_parts) if system_parts else None
    _check_openai_tool_pairs(raw_messages)
    return ChatRequest("openai", model, system, tuple(messages), max_tokens, body)


def _check_anthropic_turns(raw: list[Any]) -> None:
    """What the Messages API refuses about turns and tools: two turns of one role in a
    row, an empty text block, a tool_result that answers no tool_use of the turn just
    before it (or comes after the turn's text), a tool_use left unanswered by the next
    turn (the last turn may end with calls in flight)."""
    for i, message in enumerate(raw):
        if i and raw[i - 1]["role"] == message["role"]:
            raise _BadRequest(f"messages.{i}: roles must alternate between user and assistant")
        blocks = message.get("content")
        if not isinstance(blocks, list):
            continue
        kinds = [b.get("type") for b in blocks]
        if any(b.get("type") == "text" and not str(b.get("text", "")).strip() for b in blocks):
            raise _BadRequest(f"messages.{i}: text content blocks must be non-empty")
        leading = len(kinds) - len(list(itertools.dropwhile(lambda k: k == "tool_result", kinds)))
        if "tool_result" in kinds[leading:]:
            raise _BadRequest(f"messages.{i}: tool_result blocks must come first")
        results = {b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"}
        before = raw[i - 1].get("content") if i else None
        uses = (
            {b.get("id") for b in before if b.get("type") == "tool_use"}
            if isinstance(before, list)
            else set()
        )
        if results - uses:
            raise _BadRequest(
                f"messages.{i}: tool_result for an unknown tool_use {sorted(results - uses)}"
            )
        own = {b.get("id") for b in blocks if b.get("type") == "tool_use"}
        after = raw[i + 1].get("content") if i + 1 < len(raw) else None
        if own and i + 1 < len(raw):
            answered = (
                {b.get("tool_use_id") for b in after if b.get("type") == "tool_result"}
                if isinstance(after, list)
                else set()
            )
            if own - answered:
                raise _BadRequest(
                    f"messages.{i}: tool_use ids without tool_result blocks: {sorted(own - answered)}"
                )


def _check_openai_tool_pairs(raw: list[Any]) -> None:
    """What Chat Completions refuses: a tool message that responds to no tool_calls of
    the assistant message before it, or an assistant's tool_calls not all answered
    before the next message (unless it is the last message)."""
    open_calls: set[str] = set()
    for i, message in enumerate(raw):
        role = message.get("role")
        if role == "tool":
            call = message.get("tool_call_id")
            if call not in open_calls:
                raise _BadRequest(
                    f"messages[{i}]: role 'tool' must be a response to a preceding message with 'tool_calls' ({call!r})"
                )
            open_calls.discard(call)
            continue
        if open_calls:
            raise _BadRequest(
                f"messages[{i - 1}]: tool_call_ids did not have response messages: {sorted(open_calls)}"
            )
        calls = message.get("tool_calls") or []
        open_calls = {c.get("id") for c in calls if isinstance(c, dict)}
        for c in calls:
            function = c.get("function") or {}
            if (
                c.get("type") != "function"
                or not function.get("name")
                or not isinstance(function.get("arguments"), str)
            ):
                raise _BadRequest(
                    f"messages[{i}].tool_calls: each needs type 'function', a name and arguments (a JSON string)"
                )
            json.loads(function["arguments"])


def _require_str(body: Mapping[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise _BadRequest(f"{key}: field required")
    return value


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                texts.append(str(block.get("text", "")))
            elif kind == "tool_use" and isinstance(block.get("input"), dict) and block.get("id"):
                texts.append(json.dumps(block["input"]))
            elif kind == "tool_result" and block.get("tool_use_id"):
                texts.append(_content_text(block.get("content", ""), f"{where}.tool_result"))
            else:
                raise _BadRequest(f"{where}.content: text, tool_use or tool_result blocks only")
        return "".join(texts)
    raise _BadRequest(f"{where}.content: must be a string or an array of blocks")


# The tokenizer stand-in's pieces: a run of letters, of digits, of punctuation.
_PIECE = re.compile(r"[^\W\d_]+|\d+|[^\w\s]+|_+")
#: What a provider's chat template adds per message (role markers, separators),
#: as OpenAI documents for its chat models (3 tokens a message).
MESSAGE_OVERHEAD_TOKENS = 3


def stand_in_tokens(*texts: str) -> int:
    """A deterministic word-piece-like token count, standing in for a provider's
    tokenizer: an ASCII word is one token per 6 letters started, a non-ASCII word
    with a non-ASCII letter (CJK, say) one per letter, a number one per 3 digits,
    punctuation one per 2 characters, whitespace free. English prose comes out
    near 0.2 tokens a character, code and hex digests higher (as real tokenizers
    count them), so it differs from the service's characters / 4 both ways: what
    the calibration (``core.domain.calibration``) has to learn."""
    total = 0
    for text in texts:
        for piece in _PIECE.findall(text):
            if piece[0].isdigit():
                total += -(-len(piece) // 3)
            elif piece[0].isalpha():
                total += 1 + (len(piece) - 1) // 6 if piece.isascii() else len(piece)
            else:
                total += -(-len(piece) // 2)
    return total


def request_tokens(chat: ChatRequest) -> int:
    """A chat request's input tokens as this server bills them: its texts, plus
    the template's tokens per message (the system prompt counting as one)."""
    messages = len(chat.messages) + (1 if chat.system else 0)
    return stand_in_tokens(chat.system or "", *(c for _, c in chat.messages)) + (
        MESSAGE_OVERHEAD_TOKENS * messages
    )


_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def _error_response(
    protocol: Protocol,
    status: int,
    message: str,
    code: str | None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """An error body shaped like the provider's, so the SDK classifies it the
    way it would classify the real thing."""
    if protocol == "anthropic":
        error_type = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
        body: dict[str, Any] = {
            "type": "error",
            "error": {"type": error_type, "message": message},
            "request_id": "req_test_error",
        }
    else:
        body = {
            "error": {
                "message": message,
                "type": "server_error" if status >= 500 else "invalid_request_error",
                "param": None,
                "code": code,
            }
        }
    return web.json_response(body, status=status, headers=dict(headers or {}))


def _scripted_failure(protocol: Protocol, action: Action) -> web.Response:
    if isinstance(action, RateLimited):
        headers = {} if action.retry_after is None else {"retry-after": f"{action.retry_after:g}"}
        return _error_response(
            protocol, 429, "rate limited by test server", "rate_limit_exceeded", headers
        )
    if isinstance(action, ServerError):
        return _error_response(protocol, action.status, "internal test-server error", None)
    if isinstance(action, Overloaded):
        return _error_response(protocol, 529, "Overloaded", None)
    if isinstance(action, HTTPError):
        return _error_response(protocol, action.status, action.message, action.code)
    if isinstance(action, Malformed):
        return web.Response(status=200, text=action.body, content_type=action.content_type)
    raise AssertionError(f"not a failure action: {action!r}")


# --------------------------------------------------------------------------
# Standalone mode
# --------------------------------------------------------------------------


async def _serve_forever(port: int, latency_seconds: float, embedding_dim: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with LLMTestServer(
        port=port, latency_seconds=latency_seconds, embedding_dim=embedding_dim
    ) as server:
        # The first stdout line is the contract with whoever started us.
        print(server.base_url, flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.llm_server",
        description="Local Anthropic/OpenAI-compatible test server (127.0.0.1 only).",
    )
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay before every reply")
    parser.add_argument("--embedding-dim", type=int, default=64)
    args = parser.parse_args(argv)
    asyncio.run(_serve_forever(args.port, args.latency_ms / 1000.0, args.embedding_dim))
    return 0


if __name__ == "__main__":
    sys.exit(main())
