-- Issue 29: LLM spend that is not a compactions row, kept as content-free
-- aggregates per tenant and UTC day.
--
-- source 'failed': a compaction whose summariser spent tokens and then failed
-- (its apply refused, for one): one row per failed attempt, so that usage and
-- the tenant's [[tenants]] llm_tokens_per_day count it (a compaction failing
-- at every attempt used to be free). budget_tokens is what the daily budget
-- counts (every LLM token; 0 for the extractive summariser's).
--
-- source 'erased': an erase folds the conversation's compactions rows into
-- sums per tenant and UTC day before it deletes them (one row per tenant and
-- day per erase), so it neither refunds the tenant's budget of the day nor
-- removes its usage history.
--
-- No conversation_id column (nor compaction id, nor content): an erase leaves
-- these rows, and they say nothing about any one conversation. Row-level
-- security by tenant: the views read as compactor_reader, which sees its
-- tenant's rows (all with '*'), as for the tables compactor_protect covers.
-- A worker of the previous release never reads or writes it.
CREATE TABLE IF NOT EXISTS usage_aggregates (
    tenant_id            text,
    day                  date             NOT NULL,
    source               text             NOT NULL CHECK (source IN ('failed', 'erased')),
    compactions          integer          NOT NULL DEFAULT 0,
    failed_compactions   integer          NOT NULL DEFAULT 0,
    llm_calls            bigint           NOT NULL DEFAULT 0,
    input_tokens         bigint           NOT NULL DEFAULT 0,
    output_tokens        bigint           NOT NULL DEFAULT 0,
    cache_read_tokens    bigint           NOT NULL DEFAULT 0,
    cache_write_tokens   bigint           NOT NULL DEFAULT 0,
    budget_tokens        bigint           NOT NULL DEFAULT 0,
    cost_usd             double precision NOT NULL DEFAULT 0,
    fallback_compactions integer          NOT NULL DEFAULT 0,
    recorded_at          timestamptz      NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS usage_aggregates_tenant_day_idx ON usage_aggregates (tenant_id, day);

ALTER TABLE usage_aggregates ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_read ON usage_aggregates;
CREATE POLICY tenant_read ON usage_aggregates AS PERMISSIVE FOR SELECT TO compactor_reader
    USING (current_setting('compactor.tenant', true) = '*'
           OR tenant_id = current_setting('compactor.tenant', true));
GRANT SELECT ON usage_aggregates TO compactor_reader;
