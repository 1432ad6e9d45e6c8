-- Switchyard on PostgreSQL, schema version 1.
--
-- Plain SQL for the default table name `switchyard_jobs` in the connection's default
-- schema. The transport applies it with `"switchyard_jobs` replaced by the configured,
-- validated QUEUE_SCHEMA and QUEUE_TABLE (`"tenant"."jobs`), and the bare name in index
-- names replaced by the table name.
--
-- Times are `timestamptz` (microsecond precision) and "now" is always the server's
-- clock, so leases and delays never depend on a worker's clock.

CREATE TABLE IF NOT EXISTS "switchyard_jobs" (
    seq          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY, -- publish order, the FIFO tie-breaker
    id           text        NOT NULL UNIQUE, -- envelope id; text so that a foreign row can still be quarantined
    queue        text        NOT NULL,
    kind         text        NOT NULL,
    priority     integer     NOT NULL DEFAULT 0,
    attempts     integer     NOT NULL DEFAULT 0,
    ready        boolean     NOT NULL DEFAULT false, -- due and free: in the claim index
    started      boolean     NOT NULL DEFAULT false, -- a handler began the current lease: only then does a lapsed lease count an attempt
    available_at timestamptz NOT NULL,               -- due time
    visible_at   timestamptz NOT NULL,               -- claimable from: the due time, or the lease end while reserved
    expires_at   timestamptz,
    token        uuid,                               -- lease token of the current or last reservation; NULL when free
    reserved_at  timestamptz,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    envelope     text        NOT NULL                -- the v1 envelope JSON as published, byte for byte
);

-- Every ack deletes and every claim rewrites a row, so a busy queue table makes dead
-- tuples fast: vacuum it after 1% of its rows changed (not the default 20%), without
-- the cost-based sleep. See the README's "PostgreSQL" section.
ALTER TABLE "switchyard_jobs" SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- The claim walks this index in delivery order and stops at the batch size. It holds
-- only ready rows, so delayed and in-flight rows never slow a claim or an empty poll.
CREATE INDEX IF NOT EXISTS switchyard_jobs_claim
    ON "switchyard_jobs" (queue, priority DESC, visible_at, seq) WHERE ready;

-- Waiting rows (delayed, or leased) by the time they become claimable: a reserve
-- promotes the due ones into the claim index with one range scan.
CREATE INDEX IF NOT EXISTS switchyard_jobs_due
    ON "switchyard_jobs" (visible_at) WHERE NOT ready;

CREATE INDEX IF NOT EXISTS switchyard_jobs_expiry
    ON "switchyard_jobs" (expires_at) WHERE expires_at IS NOT NULL;

CREATE TABLE IF NOT EXISTS "switchyard_jobs_dead" (
    id         text        PRIMARY KEY,
    queue      text        NOT NULL,
    kind       text        NOT NULL,
    priority   integer     NOT NULL DEFAULT 0,
    attempts   integer     NOT NULL DEFAULT 0,
    expires_at timestamptz,
    reason     text        NOT NULL,
    last_error text,
    dead_at    timestamptz NOT NULL,
    envelope   text        NOT NULL  -- kept verbatim, even when it cannot be decoded
);

CREATE INDEX IF NOT EXISTS switchyard_jobs_dead_queue
    ON "switchyard_jobs_dead" (queue, dead_at);
