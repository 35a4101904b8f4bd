-- Issue 28: pinned messages and the gate before a compaction takes effect.
--
-- messages.pinned: a message the producer sent with "pinned": true, or an
-- operator pinned (`compactor pin`, POST /admin/conversations/{id}/pin): the
-- compactor keeps it verbatim (docs/memory.md, "Pinned messages"). A column
-- with a constant default: instant, and a worker of the previous release,
-- which neither writes nor reads it, stores its messages unpinned.
--
-- compaction_rejections: each compaction the gate refused (core/domain/gate.py),
-- with its reason, written after the refused transaction rolled back; the
-- inspector lists them. Holds ids, a reason and counts, never content. Erased
-- with the conversation (core/adapters/postgres/privacy.py, ERASED_TABLES) and
-- under row-level security like every table with a conversation_id.
ALTER TABLE messages ADD COLUMN IF NOT EXISTS pinned boolean NOT NULL DEFAULT false;

CREATE TABLE IF NOT EXISTS compaction_rejections (
    conversation_id text        NOT NULL,
    compaction_id   text        NOT NULL,
    summarizer      text        NOT NULL,
    reason          text        NOT NULL,
    detail          text        NOT NULL,
    rejected_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conversation_id, compaction_id, summarizer)
);

SELECT compactor_protect('compaction_rejections'::regclass);
