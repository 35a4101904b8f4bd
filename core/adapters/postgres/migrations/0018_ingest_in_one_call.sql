-- Issue 29: the accounting hot path in one round trip.
--
-- A group of incoming messages took six round trips (BEGIN, the conversations'
-- advisory locks, their erase marks, the conversations' tenants and
-- watermarks, the insert, COMMIT), and the worker waited on each: under a
-- backlog the group's store was most of the agent's time (docs/performance.md
-- section 2). compactor_ingest does them in one call, as one statement: alone,
-- it is its own transaction.
--
-- It locks the group's conversations (sorted, so two callers cannot deadlock;
-- apply_compaction takes one of them), then reads their erase marks. A
-- VOLATILE function takes a fresh snapshot for each statement, so the marks are
-- read after the locks are held and an erase cannot commit between that read
-- and the insert (core/adapters/postgres/ingest.py). With check_marks, a group
-- touching an erased conversation (its own mark, or a legacy mark of its
-- producer's id, migration 0010) gets the marks back and nothing is written:
-- which of its messages an erase covers is core.domain.erasure's rule, applied
-- by the caller, which then calls again with only the messages to store and
-- check_marks false, in its own transaction holding the same locks.
--
-- The watermark of each conversation is its newest message of the call (the
-- arrays are in the topic's order); a message an archived batch covers was
-- compacted and deleted and is not stored again (a redelivery); a repeated id
-- is stored once. Each inserted row is returned with its arrival number
-- (seq). Only the owner and compactor_writer may call it.
CREATE OR REPLACE FUNCTION compactor_ingest(
    check_marks boolean, lock_class integer, keys text[], bare_keys text[],
    ids text[], conversation_ids text[], tenants text[], roles text[], contents text[],
    tool_calls text[], tool_call_ids text[], created_ats timestamptz[],
    token_estimates integer[], pins boolean[], partitions integer[], source_offsets bigint[]
) RETURNS TABLE (conversation_id text, id text, seq bigint, legacy boolean,
                 epoch integer, offsets jsonb, cutoff timestamptz)
LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
BEGIN
    PERFORM pg_advisory_xact_lock(lock_class, k.h)
       FROM (SELECT DISTINCT hashtext(c) AS h FROM unnest(keys) AS c ORDER BY 1) AS k;
    IF check_marks THEN
        RETURN QUERY
            SELECT e.conversation_id, NULL::text, NULL::bigint, false, e.epoch, e.offsets, e.cutoff
              FROM erasures AS e WHERE e.conversation_id = ANY(keys)
            UNION ALL
            SELECT l.conversation_id, NULL::text, NULL::bigint, true, 0, l.offsets, l.cutoff
              FROM legacy_erasures AS l WHERE l.conversation_id = ANY(bare_keys);
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    INSERT INTO conversations AS c (conversation_id, tenant_id, last_message_id,
                                    source_partition, source_offset)
    SELECT DISTINCT ON (n.key) n.key, n.tenant, n.id, n.part, n.off
      FROM unnest(conversation_ids, tenants, ids, partitions, source_offsets)
           WITH ORDINALITY AS n(key, tenant, id, part, off, ord)
     ORDER BY n.key, n.ord DESC
    ON CONFLICT ON CONSTRAINT conversations_pkey DO UPDATE
       SET last_message_id = EXCLUDED.last_message_id,
           source_partition = EXCLUDED.source_partition,
           source_offset = EXCLUDED.source_offset
     WHERE EXCLUDED.source_offset IS NOT NULL
       AND (c.source_offset IS NULL
            OR c.source_partition IS DISTINCT FROM EXCLUDED.source_partition
            OR EXCLUDED.source_offset > c.source_offset);
    RETURN QUERY
        WITH inserted AS (
            INSERT INTO messages AS m (id, conversation_id, role, content, tool_calls,
                                       tool_call_id, created_at, token_estimate, pinned)
            SELECT r.id, r.key, r.role, r.content, r.calls::jsonb, r.call_id, r.at,
                   r.tokens, r.pinned
              FROM unnest(ids, conversation_ids, roles, contents, tool_calls, tool_call_ids,
                          created_ats, token_estimates, pins)
                   WITH ORDINALITY AS r(id, key, role, content, calls, call_id, at, tokens,
                                        pinned, ord)
             WHERE NOT EXISTS (
                   SELECT 1 FROM archival_memory AS a
                    WHERE a.conversation_id = r.key AND a.source_message_ids @> ARRAY[r.id])
             ORDER BY r.ord
            ON CONFLICT ON CONSTRAINT messages_pkey DO NOTHING
            RETURNING m.conversation_id, m.id, m.seq
        )
        SELECT i.conversation_id, i.id, i.seq, NULL::boolean, NULL::integer, NULL::jsonb,
               NULL::timestamptz
          FROM inserted AS i;
END
$fn$;

REVOKE ALL ON FUNCTION compactor_ingest(boolean, integer, text[], text[], text[], text[], text[],
    text[], text[], text[], text[], timestamptz[], integer[], boolean[], integer[], bigint[])
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION compactor_ingest(boolean, integer, text[], text[], text[], text[],
    text[], text[], text[], text[], text[], timestamptz[], integer[], boolean[], integer[],
    bigint[]) TO compactor_writer;
