"""The compaction engine: everything that works without Kafka.

* ``domain/``: pure decisions and types (no I/O, no asyncio, no logging; the
  time only as an argument or an injectable clock), so they can be tested with
  plain values and replayed deterministically;
* ``ports/``: the protocols, data types and errors the engine and the service
  depend on (storage, model, embedding, publisher, the compactor);
* ``compactor.py``, ``summarizer.py``, ``provider_guard.py``: the shells that
  run the domain over the ports (the compactor plans, it writes nothing);
* ``adapters/``: PostgreSQL, the LLM SDKs and the embedders behind the ports,
  each mapping its driver's errors to the ports' at the edge;
* ``settings.py``: ``config.toml`` loading and validation.

import-linter (pyproject.toml) keeps ``domain`` and ``ports`` pure and the
whole of ``core`` free of Kafka and Faust.
"""
