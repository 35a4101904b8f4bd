-- BM25 statistics of the archived raw turns, kept where the turns are archived.
--
-- memory_read ranks raw turns by BM25, which needs the number of turns in
-- the searched scope, their average length and, for each query term, how
-- many turns hold it. Computing those per query read every turn of the scope
-- (a 700-turn conversation: hundreds of milliseconds; a tenant: all of its
-- turns). They are now counted once, when turns are archived, and taken back
-- when turns are removed, by triggers on archived_messages (below): in the
-- statement's own transaction, whoever writes the turns (a compaction, the
-- retention timer, an erase, or a worker of the previous release during a
-- rolling upgrade, which knows nothing of these tables). A tenant's figures
-- are the sums over its conversations (conversations.tenant_id), read at
-- query time.
--
-- word_count is a turn's length for BM25: its words, stop words included.
-- Counting only the lexemes left after the English stop words made most short
-- turns the same length, and BM25 then could not prefer the focused one
-- (docs/memory.md, "Why raw turns trailed BM25").

-- Kept by a trigger rather than as a stored generated column: adding one
-- rewrites archived_messages and rebuilds its indexes under an exclusive
-- lock (6 s per 20,000 turns on the loaded cores here, every compaction
-- waiting). A plain nullable column is added at once; the turns already
-- archived get theirs from the backfill below. Databases migrated by 0.3.0
-- have the generated column; both hold the same figures, and no statement
-- writes word_count, so the code cannot tell them apart.
ALTER TABLE archived_messages ADD COLUMN word_count integer;

CREATE FUNCTION compactor_archived_word_count() RETURNS trigger
LANGUAGE plpgsql AS $count$
BEGIN
    NEW.word_count := regexp_count(NEW.content, '\w+');
    RETURN NEW;
END
$count$;

CREATE TRIGGER archived_messages_word_count
    BEFORE INSERT OR UPDATE OF content ON archived_messages
    FOR EACH ROW EXECUTE FUNCTION compactor_archived_word_count();

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

-- The turns archived before this migration get their word_count and are
-- counted after its transaction, in batches of conversations that each lock
-- archived_messages for a moment (core/adapters/postgres/migrate_backfill.py),
-- not here: in one transaction, behind the ALTER TABLE's lock, this blocked
-- every compaction for about 19 s per 100,000 turns. The queue lists the
-- conversations to count, with their turns (to size the batches); even
-- listing them reads every turn, so it is listed after this transaction
-- too: the row '' (no conversation has an empty id) says "not listed yet".
-- Listing late may take in conversations whose every turn the triggers
-- counted; recounting one gives the same figures. The backfill drops the
-- queue once empty. Until then a listed conversation's figures count only
-- the turns archived since.
CREATE TABLE archived_stats_backfill (
    conversation_id text   PRIMARY KEY,
    turns           bigint NOT NULL
);

INSERT INTO archived_stats_backfill (conversation_id, turns) VALUES ('', 0);

SELECT compactor_protect('archived_turn_stats');
SELECT compactor_protect('archived_term_stats');

-- Statement-level triggers with transition tables: one upsert per statement
-- and conversation, whatever the number of turns. A compaction's turns are
-- written under its conversation's advisory lock, so two statements never
-- count into one conversation's rows at once; retention and erase take the
-- same lock.
CREATE FUNCTION compactor_archived_stats_add() RETURNS trigger
LANGUAGE plpgsql AS $add$
BEGIN
    INSERT INTO archived_turn_stats AS s (conversation_id, turns, words)
    SELECT conversation_id, count(*), coalesce(sum(word_count), 0)
      FROM added GROUP BY conversation_id
     ORDER BY conversation_id
    ON CONFLICT (conversation_id) DO UPDATE
       SET turns = s.turns + excluded.turns, words = s.words + excluded.words;
    INSERT INTO archived_term_stats AS s (conversation_id, lexeme, turns)
    SELECT a.conversation_id, u.lexeme, count(*)
      FROM added AS a, unnest(a.content_tsv) AS u
     GROUP BY a.conversation_id, u.lexeme
     ORDER BY a.conversation_id, u.lexeme
    ON CONFLICT (conversation_id, lexeme) DO UPDATE SET turns = s.turns + excluded.turns;
    RETURN NULL;
END
$add$;

CREATE FUNCTION compactor_archived_stats_remove() RETURNS trigger
LANGUAGE plpgsql AS $remove$
BEGIN
    -- GREATEST: while a conversation waits in archived_stats_backfill, its
    -- figures count only its newer turns, and an erase removes older ones too.
    UPDATE archived_turn_stats AS s
       SET turns = GREATEST(s.turns - r.turns, 0), words = GREATEST(s.words - r.words, 0)
      FROM (SELECT conversation_id, count(*) AS turns, coalesce(sum(word_count), 0) AS words
              FROM removed GROUP BY conversation_id) AS r
     WHERE s.conversation_id = r.conversation_id;
    UPDATE archived_term_stats AS s
       SET turns = GREATEST(s.turns - r.turns, 0)
      FROM (SELECT k.conversation_id, u.lexeme, count(*) AS turns
              FROM removed AS k, unnest(k.content_tsv) AS u
             GROUP BY k.conversation_id, u.lexeme) AS r
     WHERE s.conversation_id = r.conversation_id AND s.lexeme = r.lexeme;
    DELETE FROM archived_term_stats AS s
     USING (SELECT DISTINCT conversation_id FROM removed) AS r
     WHERE s.conversation_id = r.conversation_id AND s.turns <= 0;
    DELETE FROM archived_turn_stats AS s
     USING (SELECT DISTINCT conversation_id FROM removed) AS r
     WHERE s.conversation_id = r.conversation_id AND s.turns <= 0;
    RETURN NULL;
END
$remove$;

CREATE TRIGGER archived_messages_stats_add
    AFTER INSERT ON archived_messages
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION compactor_archived_stats_add();

CREATE TRIGGER archived_messages_stats_remove
    AFTER DELETE ON archived_messages
    REFERENCING OLD TABLE AS removed
    FOR EACH STATEMENT EXECUTE FUNCTION compactor_archived_stats_remove();
