-- The raw turns behind every archived batch.
--
-- A compaction used to delete the messages it summarised. They now move, in
-- the compaction's own transaction, into archived_messages, linked to the
-- depth-0 batch that summarised them (archival_memory.id). memory_read ranks
-- them next to the summaries, and GET /conversations/{id}/batches/{batch_id}
-- returns a batch with all of them. The live history (messages) no longer
-- holds them. Rows older than [archive].raw_retention_days (0 = forever,
-- counted from archived_at) are removed by the worker's reconciliation timer.
--
-- Keyed by conversation_id like every table a later issue distributes.

CREATE TABLE archived_messages (
    conversation_id text        NOT NULL,
    id              text        NOT NULL,
    -- The depth-0 batch whose summary covers this turn (a deeper batch covers
    -- it through its source_message_ids).
    batch_id        text,
    compaction_id   text        NOT NULL,
    role            text        NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
    content         text        NOT NULL,
    tool_calls      jsonb,
    tool_call_id    text,
    created_at      timestamptz NOT NULL,
    token_estimate  integer     NOT NULL CHECK (token_estimate >= 0),
    -- Arrival number the message had in the live history.
    seq             bigint      NOT NULL,
    archived_at     timestamptz NOT NULL DEFAULT now(),
    embedding       vector,
    embedding_model text,
    content_tsv     tsvector    GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    PRIMARY KEY (conversation_id, id),
    CONSTRAINT archived_messages_embedding_has_model
        CHECK (embedding IS NULL OR embedding_model IS NOT NULL)
);

CREATE INDEX archived_messages_content_tsv_idx ON archived_messages USING gin (content_tsv);
CREATE INDEX archived_messages_batch_idx ON archived_messages (conversation_id, batch_id);
CREATE INDEX archived_messages_archived_at_idx ON archived_messages (archived_at);
