-- Issue 18: what each compaction cost, per tenant, and the specifics ledger.
--
-- compactions: the LLM spend of the compaction (calls; input, output, cache
-- read and cache write tokens; the summariser and model; the estimated cost
-- from [usage].prices) and whether a spent tenant budget sent it to the
-- extractive summariser. tenant_id is the tenant of the conversation key
-- (core.domain.tenancy.tenant_of), kept on the row so that usage by tenant
-- and day, and a tenant's spend today (its [[tenants]] llm_tokens_per_day),
-- are one index range scan. Rows from before have no usage: zeros, summariser
-- unknown (NULL), which no tenant budget counts.
ALTER TABLE compactions
    ADD COLUMN tenant_id          text,
    ADD COLUMN summarizer         text,
    ADD COLUMN model              text,
    ADD COLUMN llm_calls          integer          NOT NULL DEFAULT 0,
    ADD COLUMN input_tokens       bigint           NOT NULL DEFAULT 0,
    ADD COLUMN output_tokens      bigint           NOT NULL DEFAULT 0,
    ADD COLUMN cache_read_tokens  bigint           NOT NULL DEFAULT 0,
    ADD COLUMN cache_write_tokens bigint           NOT NULL DEFAULT 0,
    ADD COLUMN cost_usd           double precision,
    ADD COLUMN budget_fallback    boolean          NOT NULL DEFAULT false;

UPDATE compactions AS c
   SET tenant_id = conv.tenant_id
  FROM conversations AS conv
 WHERE conv.conversation_id = c.conversation_id
   AND conv.tenant_id IS NOT NULL;

CREATE INDEX compactions_tenant_day_idx ON compactions (tenant_id, created_at);

-- archival_memory: the batch's specifics (ranked, what a re-summary carries
-- forward) and its ledger (those its "Specifics" section shows), as JSON
-- arrays of {kind, text, message_id, score}; NULL for batches from before.
ALTER TABLE archival_memory
    ADD COLUMN specifics jsonb,
    ADD COLUMN ledger    jsonb;
