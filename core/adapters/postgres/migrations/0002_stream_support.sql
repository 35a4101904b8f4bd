-- What the streaming service needs on top of the compaction store.

-- Arrival order of messages. A compaction command carries the last seq its
-- conversation had when it was issued, so messages that arrive while it runs
-- are never touched, whatever their (producer-supplied) created_at says.
ALTER TABLE messages ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY;
CREATE INDEX messages_conversation_seq_idx ON messages (conversation_id, seq);

-- Transactional outbox: events a compaction must publish are written in the
-- compaction's own transaction and relayed to Kafka afterwards (at least once).
CREATE TABLE outbox (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    compaction_id text        NOT NULL,
    topic         text        NOT NULL,
    key           text        NOT NULL,
    payload       text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz
);

CREATE INDEX outbox_unpublished_idx ON outbox (id) WHERE published_at IS NULL;
CREATE INDEX outbox_compaction_idx ON outbox (compaction_id);
