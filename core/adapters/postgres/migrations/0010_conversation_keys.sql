-- A conversation is (tenant, producer's id): every table is keyed by the
-- conversation key that encodes the pair (core/domain/tenancy.py):
--
--   acme/support-1   tenant acme, conversation support-1
--   support-1        no tenant (unchanged)
--   /a/b             no tenant, conversation a/b (an id holding '/' is prefixed)
--
-- Before, a conversation id was global and the first message's tenant_id
-- claimed it: a producer could squat another tenant's id or write into its
-- conversation. Now the same id under two tenants is two conversations.
--
-- The workers must be stopped while this runs (docs/operations.md,
-- "Upgrading"): a worker of the previous release would go on storing a
-- tenant's messages under the bare id.

-- 1. Conversations stored before tenants existed (migration 0005) have data
-- and no conversations row. They are conversations without a tenant, and say
-- so now; `compactor tenants assign` moves one into its tenant. No message
-- adopts them: a message naming a tenant names another conversation.
INSERT INTO conversations (conversation_id, tenant_id)
SELECT conversation_id, NULL FROM (
    SELECT conversation_id FROM messages
    UNION SELECT conversation_id FROM archival_memory
    UNION SELECT conversation_id FROM archived_messages
    UNION SELECT conversation_id FROM compactions
) AS stored
ON CONFLICT (conversation_id) DO NOTHING;

-- 2. Erases applied so far are kept by the bare id as well, their tenant being
-- unknown once the conversation's row is gone: such a mark covers its id under
-- every tenant (core/adapters/postgres/ingest.py, _MARKS_SQL). Ids, offsets
-- and times only, like erasures.
CREATE TABLE legacy_erasures (
    conversation_id text        PRIMARY KEY,
    offsets         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    cutoff          timestamptz NOT NULL
);
INSERT INTO legacy_erasures (conversation_id, offsets, cutoff)
SELECT conversation_id, offsets, cutoff FROM erasures;
SELECT compactor_protect('legacy_erasures');

-- 3. The new key of every conversation whose key changes: a tenant's, and an
-- id holding '/' without a tenant (an erased one included: its tenant is
-- unknown, so it stays a conversation without one).
CREATE TEMP TABLE conversation_rekey ON COMMIT DROP AS
SELECT conversation_id AS old_key,
       CASE WHEN tenant_id IS NOT NULL THEN tenant_id || '/' || conversation_id
            ELSE '/' || conversation_id END AS new_key
  FROM conversations
 WHERE tenant_id IS NOT NULL OR strpos(conversation_id, '/') > 0;

INSERT INTO conversation_rekey (old_key, new_key)
SELECT DISTINCT orphan.conversation_id, '/' || orphan.conversation_id
  FROM (SELECT conversation_id FROM erasures
        UNION SELECT conversation_id FROM erase_audit
        UNION SELECT conversation_id FROM outbox) AS orphan
 WHERE strpos(orphan.conversation_id, '/') > 0
   AND NOT EXISTS (SELECT 1 FROM conversations AS c
                    WHERE c.conversation_id = orphan.conversation_id);

-- 4. Re-key in two passes (through a prefix no key has), so that a new key
-- never meets an old one not yet moved in a primary key.
CREATE FUNCTION pg_temp.compactor_rekey(tbl regclass, marker text) RETURNS void
LANGUAGE plpgsql AS $rekey$
BEGIN
    EXECUTE format(
        'UPDATE %s AS t SET conversation_id = $1 || r.new_key '
        'FROM conversation_rekey AS r WHERE t.conversation_id = r.old_key', tbl)
    USING marker;
END
$rekey$;

CREATE FUNCTION pg_temp.compactor_unmark(tbl regclass, marker text) RETURNS void
LANGUAGE plpgsql AS $unmark$
BEGIN
    EXECUTE format(
        'UPDATE %s SET conversation_id = substr(conversation_id, length($1) + 1) '
        'WHERE starts_with(conversation_id, $1)', tbl)
    USING marker;
END
$unmark$;

SELECT pg_temp.compactor_rekey(t::regclass, E'\x1f\x1e')
  FROM unnest(ARRAY['messages', 'archival_memory', 'archived_messages', 'compactions',
                    'outbox', 'erasures', 'erase_audit', 'conversations']) AS t;
SELECT pg_temp.compactor_unmark(t::regclass, E'\x1f\x1e')
  FROM unnest(ARRAY['messages', 'archival_memory', 'archived_messages', 'compactions',
                    'outbox', 'erasures', 'erase_audit', 'conversations']) AS t;

-- 5. Clip-archive events not yet relayed go out under the conversation key,
-- like every later one (the clip-archives topic is log-compacted by key).
UPDATE outbox SET key = conversation_id
 WHERE topic = 'clip_archives' AND key <> conversation_id;

-- 6. And name their tenant, as every later event does.
UPDATE outbox AS o
   SET payload = jsonb_set(o.payload::jsonb, '{tenant_id}', to_jsonb(c.tenant_id))::text
  FROM conversations AS c
 WHERE c.conversation_id = o.conversation_id
   AND c.tenant_id IS NOT NULL
   AND o.published_at IS NULL;
