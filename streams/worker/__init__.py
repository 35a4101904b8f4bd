"""The worker's components: Faust-free, each testable against in-memory ports.

=================  ==============================================================
``accounting``     each record to its job, under its conversation's lock, durably
                   (the table's single writer)
``ingest``         a group of messages: decode → store → count → commands due
``control``        completions, reconcile requests, operators' recompact and restore
``erasure``        erase requests, and the clip-archive tombstones
``commands``       the command of a tally's outstanding compaction, and its sending
``failures``       the failure policy: an outage waited out, a rejection dead-lettered,
                   a group that keeps failing split to find the culprit
``intake``         ``CommandIntake``: decoded commands to the scheduler
``processor``      run one compaction command: plan, apply with its events, relay
``scheduler``      at most N compactions at once, one per conversation, acks in order
``outbox``         the events a compaction publishes, and their relay
``reconciler``     lost commands, failed compactions, a table that drifted
``dead_letters``   unusable records → the dead-letter topic, with the reason
``tally_table``    the write-behind token table and the reconciliation index
``batching``       groups of waiting events; acks after the table flush
``records``        records and their decoding
``retry``          how long to wait between tries (full jitter)
``runtime``        what is open for them (the store and the compactor)
``components``     the bundle ``streams.bootstrap`` builds
=================  ==============================================================

Nothing here imports faust, aiokafka, asyncpg or an LLM SDK (an import-linter
contract in pyproject.toml keeps it so); ``streams.kafka`` is the glue.
"""
