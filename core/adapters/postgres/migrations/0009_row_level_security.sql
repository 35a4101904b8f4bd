-- Row-level security on every table that holds a conversation's rows
-- (every table with a conversation_id column), so that a read that forgets
-- its tenant filter still sees only its tenant's rows.
--
-- Two roles (cluster-wide, created here when missing; NOLOGIN):
--
-- * compactor_reader: what the HTTP views read as. The store's scoped reads
--   run in a READ ONLY transaction that does
--       set_config('role', 'compactor_reader', true)
--       set_config('compactor.tenant', <tenant or '*'>, true)
--   (SET LOCAL: both end with the transaction). It has SELECT and nothing
--   else, and its policy shows the rows of the conversations whose tenant is
--   compactor.tenant; '*' (which no tenant id can be: tenant ids are letters,
--   digits and ._:@-) shows every row, and only the views set it, for a token
--   that is not tenant-bound. No setting (or an empty one) shows nothing.
-- * compactor_writer: the worker. Its policy permits every row, so the write
--   paths (which touch every conversation) are unchanged. The user running
--   the migrations, who owns the tables and is also the worker's user, is
--   made a member of both (SET ROLE needs membership). The tables FORCE row
--   level security, so their owner is held to the policies too: without
--   compactor_writer it would see nothing. A superuser bypasses RLS whatever
--   the policies say; the read path does not rely on the connecting user,
--   it always switches to compactor_reader.
--
-- A later migration that adds a table with a conversation_id column calls
--     SELECT compactor_protect('that_table');
-- (tests/integration/test_row_level_security.py fails for a table without
-- the policies).

DO $roles$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'compactor_reader') THEN
        BEGIN
            CREATE ROLE compactor_reader NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- created meanwhile by a migration of another database
        END;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'compactor_writer') THEN
        BEGIN
            CREATE ROLE compactor_writer NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
    IF NOT pg_has_role(current_user, 'compactor_reader', 'MEMBER') THEN
        EXECUTE format('GRANT compactor_reader TO %I', current_user);
    END IF;
    IF NOT pg_has_role(current_user, 'compactor_writer', 'USAGE') THEN
        EXECUTE format('GRANT compactor_writer TO %I', current_user);
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO compactor_reader, compactor_writer',
                   current_schema());
END
$roles$;

CREATE FUNCTION compactor_protect(tbl regclass) RETURNS void
LANGUAGE plpgsql AS $protect$
DECLARE
    visible text;
BEGIN
    IF (SELECT relname FROM pg_class WHERE oid = tbl) = 'conversations' THEN
        visible := $v$tenant_id = current_setting('compactor.tenant', true)$v$;
    ELSE
        visible := format(
            $v$EXISTS (SELECT 1 FROM conversations AS tenancy
                        WHERE tenancy.conversation_id = %s.conversation_id
                          AND tenancy.tenant_id = current_setting('compactor.tenant', true))$v$,
            tbl);
    END IF;
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', tbl);
    EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', tbl);
    EXECUTE format('DROP POLICY IF EXISTS tenant_read ON %s', tbl);
    EXECUTE format('DROP POLICY IF EXISTS worker_all ON %s', tbl);
    EXECUTE format(
        $p$CREATE POLICY tenant_read ON %s AS PERMISSIVE FOR SELECT TO compactor_reader
           USING (current_setting('compactor.tenant', true) = '*' OR %s)$p$,
        tbl, visible);
    EXECUTE format(
        'CREATE POLICY worker_all ON %s AS PERMISSIVE FOR ALL TO compactor_writer '
        'USING (true) WITH CHECK (true)',
        tbl);
    EXECUTE format('GRANT SELECT ON %s TO compactor_reader', tbl);
END
$protect$;

REVOKE ALL ON FUNCTION compactor_protect(regclass) FROM PUBLIC;

-- Every table with a conversation_id column in this schema, those of the
-- migrations before this one included.
SELECT compactor_protect(c.oid)
  FROM pg_class AS c
  JOIN pg_attribute AS a ON a.attrelid = c.oid
 WHERE c.relnamespace = current_schema()::regnamespace
   AND c.relkind IN ('r', 'p')
   AND a.attname = 'conversation_id'
   AND NOT a.attisdropped;
