-- Issue 27: the context a platform reads at every turn, in one round trip.
--
-- A turn's read took seven round trips: the version in a scoped transaction of
-- its own (BEGIN READ ONLY with the role and tenant set, the query, COMMIT),
-- then, the version having moved (it does at every turn: the platform's own
-- message), the version again and the history in a second one (BEGIN, two
-- queries, COMMIT). On a loaded machine each waits to be scheduled.
--
-- compactor_context does the scope, the version and, when the caller does not
-- already hold that version, the history, as one statement. It switches to
-- compactor_reader and sets compactor.tenant with set_config(..., true), as
-- connection.reading does: each statement of a PL/pgSQL function is checked and
-- planned on its own, so row-level security applies to the query below as the
-- reader of that tenant, even for a superuser. Both settings are local to the
-- transaction: the caller runs this alone (its own implicit transaction), so
-- the pooled connection goes back as it came.
--
-- STABLE: one snapshot for the version and the history (no message can land
-- between them), and no statement that writes can run inside.
--
-- tool_calls is text in the composite: asyncpg decodes composites only in
-- binary, and the store's connections read jsonb as text (json.loads).
--
-- The history comes back only when the conversation's version is not
-- (known_seq, known_rows) and the message asked about (through) is stored: a
-- turn that finds its context unchanged, or is still waiting for its own
-- message, reads one small row.
CREATE TYPE compactor_context_message AS (
    id text, conversation_id text, role text, content text, tool_calls text,
    tool_call_id text, created_at timestamptz, kind text, token_estimate integer,
    pinned boolean
);

CREATE FUNCTION compactor_context(
    tenant text, conversation text, through text, known_seq bigint, known_rows bigint
) RETURNS TABLE (last_seq bigint, n_rows bigint, last_message_id text,
                 source_partition integer, source_offset bigint, includes boolean,
                 history compactor_context_message[])
LANGUAGE plpgsql STABLE AS $fn$
#variable_conflict use_column
BEGIN
    PERFORM set_config('role', 'compactor_reader', true),
            set_config('compactor.tenant', tenant, true);
    RETURN QUERY
    SELECT v.last_seq, v.n_rows, c.last_message_id, c.source_partition, c.source_offset,
           w.includes,
           CASE WHEN w.includes
                 AND (v.last_seq, v.n_rows) IS DISTINCT FROM (known_seq, known_rows)
           THEN ARRAY(SELECT ROW(m.id, m.conversation_id, m.role, m.content, m.tool_calls::text,
                                 m.tool_call_id, m.created_at, m.kind, m.token_estimate,
                                 m.pinned)::compactor_context_message
                        FROM messages AS m
                       WHERE m.conversation_id = conversation
                       ORDER BY (m.kind <> 'clip_archive'), m.created_at, m.id)
           END
      FROM (SELECT coalesce(max(m.seq), 0) AS last_seq, count(*) AS n_rows
              FROM messages AS m WHERE m.conversation_id = conversation) AS v
     CROSS JOIN LATERAL (
           SELECT (through IS NULL
                   OR EXISTS (SELECT 1 FROM messages AS m
                               WHERE m.conversation_id = conversation AND m.id = through)
                   OR EXISTS (SELECT 1 FROM archived_messages AS a
                               WHERE a.conversation_id = conversation AND a.id = through))
                  AS includes) AS w
      LEFT JOIN conversations AS c ON c.conversation_id = conversation;
END
$fn$;

REVOKE ALL ON FUNCTION compactor_context(text, text, text, bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION compactor_context(text, text, text, bigint, bigint)
    TO compactor_reader;
