-- Issue 27: read-your-writes. A platform publishes a message, then reads the
-- context it must send its model; it needs to know the context includes that
-- message. Each conversation row keeps the newest record of the messages topic
-- the worker has processed for it (stored, or found stored already): the
-- message id and the record's partition and offset. Written in the ingest
-- group's own transaction, so a read that sees them sees everything up to
-- that record; never moved back (a redelivery after a crash re-processes
-- older records). NULL for conversations written before, and outside Kafka.
--
-- Nullable columns without defaults: instant, and a previous release's worker
-- (which records tenants with ON CONFLICT DO NOTHING) neither reads nor
-- writes them. An erase deletes the row (conversations is one of the erased
-- tables), a move to a tenant re-keys it.
ALTER TABLE conversations
    ADD COLUMN last_message_id  text,
    ADD COLUMN source_partition integer,
    ADD COLUMN source_offset    bigint;
