-- Conversation messages, archival memory and the compaction ledger.
--
-- Applied by core.storage.migrate inside one transaction, under an advisory
-- lock, and recorded in schema_migrations.

CREATE EXTENSION IF NOT EXISTS vector;

-- The live conversation: raw messages plus at most one clip-archive (the
-- system message standing in for everything compacted so far).
CREATE TABLE messages (
    id              text        PRIMARY KEY,
    conversation_id text        NOT NULL,
    role            text        NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
    content         text        NOT NULL,
    tool_calls      jsonb,
    tool_call_id    text,
    created_at      timestamptz NOT NULL,
    token_estimate  integer     NOT NULL CHECK (token_estimate >= 0),
    kind            text        NOT NULL DEFAULT 'message'
                                CHECK (kind IN ('message', 'clip_archive')),
    compaction_id   text,
    inserted_at     timestamptz NOT NULL DEFAULT now(),
    -- A clip-archive always names the compaction that wrote it; a raw message never does.
    CONSTRAINT messages_clip_archive_has_compaction
        CHECK ((kind = 'clip_archive') = (compaction_id IS NOT NULL))
);

CREATE INDEX messages_conversation_created_idx ON messages (conversation_id, created_at, id);

-- Two clip-archives in one conversation would mean two compactions both
-- believed they replaced the summary; the second must fail instead.
CREATE UNIQUE INDEX messages_one_clip_archive_idx
    ON messages (conversation_id) WHERE kind = 'clip_archive';

-- Every summary batch ever written. Superseded batches stay (searchable) but
-- leave the clip-archive.
CREATE TABLE archival_memory (
    id                 text        PRIMARY KEY,
    -- Creation order: plan order within a compaction, commit order across them
    -- (compactions of one conversation are serialised by an advisory lock).
    seq                bigint      GENERATED ALWAYS AS IDENTITY,
    -- Position in the clip-archive when it differs from seq: a re-summarised
    -- batch takes the place of the earliest batch it folded in. NULL = seq.
    archive_order      bigint,
    label              text        NOT NULL,
    conversation_id    text        NOT NULL,
    content            text        NOT NULL,
    depth              integer     NOT NULL CHECK (depth >= 0),
    start_time         timestamptz NOT NULL,
    end_time           timestamptz NOT NULL,
    message_count      integer     NOT NULL CHECK (message_count >= 0),
    source_message_ids text[]      NOT NULL DEFAULT '{}',
    compaction_id      text        NOT NULL,
    superseded_by      text,
    -- Untyped dimension so the embedding model can change without a migration;
    -- vectors are only ever compared within one embedding_model.
    embedding          vector,
    embedding_model    text,
    content_tsv        tsvector    GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    created_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT archival_memory_time_range CHECK (end_time >= start_time),
    CONSTRAINT archival_memory_embedding_has_model
        CHECK (embedding IS NULL OR embedding_model IS NOT NULL)
);

CREATE INDEX archival_memory_content_tsv_idx ON archival_memory USING gin (content_tsv);
CREATE INDEX archival_memory_live_idx
    ON archival_memory (conversation_id) WHERE superseded_by IS NULL;
CREATE INDEX archival_memory_conversation_seq_idx ON archival_memory (conversation_id, seq);
CREATE INDEX archival_memory_superseded_by_idx
    ON archival_memory (superseded_by) WHERE superseded_by IS NOT NULL;

-- One row per committed compaction: the idempotency key for at-least-once
-- delivery of compaction commands.
CREATE TABLE compactions (
    compaction_id       text        PRIMARY KEY,
    conversation_id     text        NOT NULL,
    status              text        NOT NULL DEFAULT 'committed' CHECK (status IN ('committed')),
    messages_compressed integer     NOT NULL,
    batches_created     integer     NOT NULL,
    tokens_before       integer     NOT NULL,
    tokens_after        integer     NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX compactions_conversation_idx ON compactions (conversation_id, created_at);
