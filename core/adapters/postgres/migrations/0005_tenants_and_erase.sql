-- Tenants, and what erasing a conversation needs.
--
-- conversations: one row per conversation, written by the first message
-- stored for it (save_messages, under the conversation's advisory lock). Its
-- tenant_id (NULL = no tenant) never changes: a later message claiming
-- another tenant is refused and dead-lettered (tenant_mismatch).
-- Conversations stored before this migration have no row until their next
-- message, whose tenant_id (or none) then becomes theirs.
--
-- outbox gets the conversation_id it always carried as its key, so that every
-- table holding a conversation's data is keyed by conversation_id and
-- erase_conversation (and its test, which lists every such table from
-- information_schema) cannot miss one.

CREATE TABLE conversations (
    conversation_id text        PRIMARY KEY,
    tenant_id       text,
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX conversations_tenant_idx ON conversations (tenant_id, conversation_id)
    WHERE tenant_id IS NOT NULL;

ALTER TABLE outbox ADD COLUMN conversation_id text;
UPDATE outbox SET conversation_id = key;
CREATE INDEX outbox_conversation_idx ON outbox (conversation_id);
