"""The worker's components: Faust-free, each testable against in-memory ports.

=================  ==============================================================
``accounting``     decode → store → tally → command (the table's single writer)
``processor``      run one compaction command: plan, apply with its events, relay;
                   ``CommandIntake`` feeds the scheduler
``scheduler``      at most N compactions at once, one per conversation, acks in order
``outbox``         the events a compaction publishes, and their relay
``reconciler``     lost commands, failed compactions, a table that drifted
``dead_letters``   unusable records → the dead-letter topic, with the reason
``tally_table``    the write-behind token table and the reconciliation index
``batching``       groups of waiting events; acks after the table flush
``records``        records and their decoding
``retry``          which failures are outages, and the backoff
``runtime``        what is open for them (the store and the compactor)
``components``     the bundle ``streams.bootstrap`` builds
=================  ==============================================================

Nothing here imports faust, aiokafka, asyncpg or an LLM SDK (an import-linter
contract in pyproject.toml keeps it so); ``streams.kafka`` is the glue.
"""
