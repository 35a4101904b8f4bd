-- Erase that holds, and its audit trail. Ids, offsets and times only: never content.
--
-- erasures: one row per erased conversation, kept after the erase (it is what
-- makes the erase hold). The ingest transaction (ingest.PostgresIngest)
-- reads it under the conversation's advisory lock and does
-- not store a message that was on the messages topic when the erase was
-- applied (its partition's offset at or below the mark in `offsets`, a JSON
-- object partition -> highest erased offset) or that was created at or before
-- `cutoff` (a replay or re-publication of the erased conversation). A later
-- message starts a new conversation. `epoch` counts the erases: it salts the
-- new conversation's compaction ids so they never repeat the erased one's.
CREATE TABLE erasures (
    conversation_id text        PRIMARY KEY,
    epoch           integer     NOT NULL CHECK (epoch > 0),
    offsets         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    cutoff          timestamptz NOT NULL,
    erased_at       timestamptz NOT NULL
);

-- erase_audit: one row per erase request, kept after the erase, keyed by
-- conversation like every table: a redelivered request (same request_id) is
-- applied again (idempotent) but audited once.
CREATE TABLE erase_audit (
    request_id      text        NOT NULL,
    conversation_id text        NOT NULL,
    requester       text        NOT NULL,
    reason          text        NOT NULL,
    requested_at    timestamptz NOT NULL,
    erased_at       timestamptz NOT NULL,
    epoch           integer     NOT NULL,
    counts          jsonb       NOT NULL,
    PRIMARY KEY (conversation_id, request_id)
);
