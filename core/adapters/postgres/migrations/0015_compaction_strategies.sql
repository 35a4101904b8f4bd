-- Issue 28: the strategy pipeline. Each compaction records which strategies ran
-- and what each freed ([{"strategy", "messages", "tokens_freed"}, ...], in the
-- order they ran); the inspector's compaction log shows it. NULL for a
-- compaction recorded before, or by a previous release's worker (which neither
-- reads nor writes the column: nullable, no default, so the ALTER is instant
-- and a rolling upgrade is safe).
ALTER TABLE compactions ADD COLUMN strategies jsonb;
