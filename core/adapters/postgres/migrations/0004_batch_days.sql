-- The calendar days (UTC) a batch's messages were written on. Chunks are
-- formed in importance order, so a batch's start_time..end_time can span
-- months while its messages come from a few days: the clip-archive lists
-- these days so it says truthfully what a batch covers. NULL for batches
-- written before this column existed.
ALTER TABLE archival_memory ADD COLUMN covered_days date[];
