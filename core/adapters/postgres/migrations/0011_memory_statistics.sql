-- BM25 statistics of the archived raw turns, kept where the turns are archived.
--
-- memory_read ranks raw turns by BM25, which needs the number of turns in
-- the searched scope, their average length and, for each query term, how
-- many turns hold it. Computing those per query read every turn of the scope
-- (a 700-turn conversation: hundreds of milliseconds; a tenant: all of its
-- turns). They are now counted once, when a compaction archives turns (in
-- its transaction, under the conversation's advisory lock) and taken back
-- when retention removes turns; an erase deletes them with the rest of the
-- conversation. A tenant's figures are the sums over its conversations
-- (conversations.tenant_id), read at query time.
--
-- word_count is a turn's length for BM25: its words, stop words included.
-- Counting only the lexemes left after the English stop words made most short
-- turns the same length, and BM25 then could not prefer the focused one
-- (docs/memory.md, "Why raw turns trailed BM25").

ALTER TABLE archived_messages
    ADD COLUMN word_count integer GENERATED ALWAYS AS (regexp_count(content, '\w+')) STORED;

-- One row per conversation with archived turns: how many, and their words.
CREATE TABLE archived_turn_stats (
    conversation_id text   PRIMARY KEY,
    turns           bigint NOT NULL CHECK (turns >= 0),
    words           bigint NOT NULL CHECK (words >= 0)
);

-- Document frequency: how many of the conversation's archived turns hold
-- each lexeme (of to_tsvector('english', content), as content_tsv).
CREATE TABLE archived_term_stats (
    conversation_id text   NOT NULL,
    lexeme          text   NOT NULL,
    turns           bigint NOT NULL CHECK (turns >= 0),
    PRIMARY KEY (conversation_id, lexeme)
);

-- A search of every conversation sums a lexeme over all of them.
CREATE INDEX archived_term_stats_lexeme_idx ON archived_term_stats (lexeme);

INSERT INTO archived_turn_stats (conversation_id, turns, words)
SELECT conversation_id, count(*), sum(word_count)
  FROM archived_messages
 GROUP BY conversation_id;

INSERT INTO archived_term_stats (conversation_id, lexeme, turns)
SELECT a.conversation_id, u.lexeme, count(*)
  FROM archived_messages AS a, unnest(a.content_tsv) AS u
 GROUP BY a.conversation_id, u.lexeme;

SELECT compactor_protect('archived_turn_stats');
SELECT compactor_protect('archived_term_stats');
