-- Every table holding a conversation's data is keyed by conversation_id: its
-- primary key starts with it. Two things follow. A message id is unique within
-- its conversation, not across all of them: producers choose ids, and before
-- this a second conversation reusing one (say "m1") had that message dropped
-- as a duplicate. And the schema can be distributed by conversation_id
-- (Citus: primary keys must contain the distribution column, docs/scaling.md).
--
-- Lookups by id alone keep a plain (non-unique) index.

ALTER TABLE messages DROP CONSTRAINT messages_pkey;
ALTER TABLE messages ADD PRIMARY KEY (conversation_id, id);

ALTER TABLE archival_memory DROP CONSTRAINT archival_memory_pkey;
ALTER TABLE archival_memory ADD PRIMARY KEY (conversation_id, id);
CREATE INDEX archival_memory_id_idx ON archival_memory (id);

ALTER TABLE compactions DROP CONSTRAINT compactions_pkey;
ALTER TABLE compactions ADD PRIMARY KEY (conversation_id, compaction_id);
CREATE INDEX compactions_compaction_id_idx ON compactions (compaction_id);

-- Rows written by a worker older than 0005 carry their conversation only as
-- the record key (events are keyed by conversation id).
UPDATE outbox SET conversation_id = key WHERE conversation_id IS NULL;
ALTER TABLE outbox ALTER COLUMN conversation_id SET NOT NULL;
ALTER TABLE outbox DROP CONSTRAINT outbox_pkey;
ALTER TABLE outbox ADD PRIMARY KEY (conversation_id, id);
CREATE INDEX outbox_id_idx ON outbox (id);
DROP INDEX outbox_conversation_idx;  -- the primary key's leading column now
