"""The compaction core: pure decisions, with every side effect behind a port.

Kept apart so the decisions can be tested with plain values, replayed
deterministically, and called from the event loop without blocking it.

Pure (no files, network, environment or logging; the time only as an
argument or an injectable clock):

* ``messages``, ``compaction``: the domain types and the ``Compactor`` port;
* ``tokens``, ``budget``: token estimates and when a conversation must be compacted;
* ``scoring``, ``split``, ``chunking``: what to compress, in what order and groups;
* ``prompts``: the structured summarisation requests;
* ``clip_archive``: the message that stands in for compressed history, and its parser;
* ``accounting``: the per-conversation tally state machine (callers pass ``now``);
* ``circuit``: the per-conversation circuit breaker (clock injectable,
  ``time.monotonic`` by default).

Not pure:

* ``settings``: the settings models and ``parse_settings`` are pure, but
  ``load_settings`` reads ``config.toml`` and ``resolve_model`` the
  environment, which is where API keys live.
* The adapters, beside their ports: ``core.model`` (Anthropic and
  OpenAI-compatible over HTTP; the extractive provider runs in-process and
  does no I/O), ``core.storage`` (PostgreSQL, the embedded server,
  migrations), ``core.embedding`` (OpenAI-compatible over HTTP, local
  sentence-transformers). The ports themselves (``core.ports.model``,
  ``core.ports.storage``, ``core.ports.embedding``) are types only.
* ``compactor``: the imperative shell that runs the pure steps and calls the
  model and the stores through their ports, with retries, timing and logs.
"""
