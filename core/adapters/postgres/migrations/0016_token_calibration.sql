-- Issue 28: the measured tokens per character of each provider's model
-- (core/domain/calibration.py), so that a restarted worker counts new
-- messages at the rate it had measured rather than at characters / 4.
--
-- tokens and chars are the decayed sums whose ratio is the rate; measured is
-- how many LLM calls went into them. One row per (provider, model), written by
-- whichever worker measured last. A worker of the previous release never
-- reads or writes it; no conversation's rows are here, so no row-level
-- security (compactor_protect) applies.
CREATE TABLE IF NOT EXISTS token_calibration (
    provider   text             NOT NULL,
    model      text             NOT NULL,
    tokens     double precision NOT NULL CHECK (tokens > 0),
    chars      double precision NOT NULL CHECK (chars > 0),
    measured   bigint           NOT NULL DEFAULT 0,
    updated_at timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, model)
);
