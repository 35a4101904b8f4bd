"""Developer tooling: a local Kafka broker (JVM + Maven), ``compactor dev``, ``compactor demo``.

Nothing under ``streams`` imports this package at module level: the worker's
import path never reaches the JVM launcher. ``streams.cli`` imports it only
inside the ``dev`` and ``demo`` commands. What the worker needs to find a
running ``dev up`` stack is in ``streams.stack_state``.
"""
