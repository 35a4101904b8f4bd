-- Issue 27: a group's store no longer waits for the compactions being written.
--
-- compactor_ingest locks every conversation of a group, and apply_compaction
-- holds one of those locks for its whole transaction. When many compactions
-- were written at once (200 conversations reaching their budget together at
-- 1,000 events/s), a group of 500 messages over those conversations waited for
-- nearly every one of them: 0.25-1.35 s a group, so a platform's own turn, in a
-- conversation no compaction touched, was readable 2-4 s after it was sent
-- (bench.turn_read; docs/performance.md, section 10).
--
-- With wait_for_locks false the function takes only the locks no one holds
-- (pg_try_advisory_xact_lock never waits, so it cannot deadlock whatever the
-- order), stores the messages of those conversations, and returns each other
-- conversation as a row with neither an id nor a legacy flag: the caller
-- stores those by a second call that waits, as before. Erase marks are read
-- for every conversation of the group: a group touching an erased one is
-- still returned its marks with nothing written.
--
-- The function of migration 0018 becomes this one with wait_for_locks true, so
-- the two cannot drift apart; a previous release's worker keeps calling it.
CREATE OR REPLACE FUNCTION compactor_ingest(
    check_marks boolean, lock_class integer, keys text[], bare_keys text[],
    ids text[], conversation_ids text[], tenants text[], roles text[], contents text[],
    tool_calls text[], tool_call_ids text[], created_ats timestamptz[],
    token_estimates integer[], pins boolean[], partitions integer[], source_offsets bigint[],
    wait_for_locks boolean
) RETURNS TABLE (conversation_id text, id text, seq bigint, legacy boolean,
                 epoch integer, offsets jsonb, cutoff timestamptz)
LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
    -- The lock keys another transaction holds (a compaction being written): few,
    -- usually none, so the tests against it below cost next to nothing.
    busy integer[] := '{}';
BEGIN
    IF wait_for_locks THEN
        PERFORM pg_advisory_xact_lock(lock_class, k.h)
           FROM (SELECT DISTINCT hashtext(c) AS h FROM unnest(keys) AS c ORDER BY 1) AS k;
    ELSE
        busy := ARRAY(SELECT k.h
                        FROM (SELECT DISTINCT hashtext(c) AS h FROM unnest(keys) AS c) AS k
                       WHERE NOT pg_try_advisory_xact_lock(lock_class, k.h));
    END IF;
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
    RETURN QUERY
        SELECT b.c, NULL::text, NULL::bigint, NULL::boolean, NULL::integer, NULL::jsonb,
               NULL::timestamptz
          FROM unnest(keys) AS b(c)
         WHERE hashtext(b.c) = ANY(busy);
    INSERT INTO conversations AS c (conversation_id, tenant_id, last_message_id,
                                    source_partition, source_offset)
    SELECT DISTINCT ON (n.key) n.key, n.tenant, n.id, n.part, n.off
      FROM unnest(conversation_ids, tenants, ids, partitions, source_offsets)
           WITH ORDINALITY AS n(key, tenant, id, part, off, ord)
     WHERE NOT (hashtext(n.key) = ANY(busy))
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
             WHERE NOT (hashtext(r.key) = ANY(busy))
               AND NOT EXISTS (
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

CREATE OR REPLACE FUNCTION compactor_ingest(
    check_marks boolean, lock_class integer, keys text[], bare_keys text[],
    ids text[], conversation_ids text[], tenants text[], roles text[], contents text[],
    tool_calls text[], tool_call_ids text[], created_ats timestamptz[],
    token_estimates integer[], pins boolean[], partitions integer[], source_offsets bigint[]
) RETURNS TABLE (conversation_id text, id text, seq bigint, legacy boolean,
                 epoch integer, offsets jsonb, cutoff timestamptz)
LANGUAGE sql VOLATILE AS $fn$
    SELECT * FROM compactor_ingest(check_marks, lock_class, keys, bare_keys, ids,
                                   conversation_ids, tenants, roles, contents, tool_calls,
                                   tool_call_ids, created_ats, token_estimates, pins,
                                   partitions, source_offsets, true)
$fn$;

REVOKE ALL ON FUNCTION compactor_ingest(boolean, integer, text[], text[], text[], text[], text[],
    text[], text[], text[], text[], timestamptz[], integer[], boolean[], integer[], bigint[],
    boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION compactor_ingest(boolean, integer, text[], text[], text[], text[],
    text[], text[], text[], text[], text[], timestamptz[], integer[], boolean[], integer[],
    bigint[], boolean) TO compactor_writer;
