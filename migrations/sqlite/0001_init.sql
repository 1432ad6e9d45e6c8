-- Switchyard on SQLite, schema version 1.
--
-- Plain SQL for the default table name `switchyard_jobs`; the transport applies it with
-- every occurrence of `switchyard_jobs` replaced by the configured, validated QUEUE_TABLE
-- (identifiers are quoted, so a name that is also an SQL keyword works).
--
-- Times are integer microseconds since the Unix epoch, so every comparison is exact and
-- "now" always comes from SQLite's own clock, never from text compared against datetime().

CREATE TABLE IF NOT EXISTS "switchyard_jobs" (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT, -- publish order, the FIFO tie-breaker; never reused
    id           TEXT    NOT NULL UNIQUE,  -- envelope id; publishing it twice stores one row
    queue        TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    priority     INTEGER NOT NULL DEFAULT 0,
    attempts     INTEGER NOT NULL DEFAULT 0,
    ready        INTEGER NOT NULL DEFAULT 0, -- 1: due and free, in the claim index; 0: delayed or leased
    started      INTEGER NOT NULL DEFAULT 0, -- 1 once a handler began the current lease: only then does a lapsed lease count an attempt
    available_at INTEGER NOT NULL,         -- due time
    visible_at   INTEGER NOT NULL,         -- claimable from: the due time, or the lease end while reserved
    expires_at   INTEGER,
    token        TEXT,                     -- lease token of the current or last reservation; NULL when free
    reserved_at  INTEGER,
    last_error   TEXT,
    created_at   INTEGER NOT NULL,
    envelope     TEXT    NOT NULL          -- the v1 envelope JSON as published
);

-- The claim walks this index in delivery order and stops at the batch size. It holds
-- only ready rows, so delayed and in-flight rows never slow a claim or an empty poll.
CREATE INDEX IF NOT EXISTS "switchyard_jobs_claim"
    ON "switchyard_jobs" (queue, priority DESC, visible_at, seq) WHERE ready = 1;

-- Waiting rows (delayed, or leased) by the time they become claimable: each reserve
-- promotes the due ones into the claim index with one range scan.
CREATE INDEX IF NOT EXISTS "switchyard_jobs_due"
    ON "switchyard_jobs" (visible_at) WHERE ready = 0;

CREATE INDEX IF NOT EXISTS "switchyard_jobs_expiry"
    ON "switchyard_jobs" (expires_at) WHERE expires_at IS NOT NULL;

CREATE TABLE IF NOT EXISTS "switchyard_jobs_dead" (
    id         TEXT    PRIMARY KEY NOT NULL,
    queue      TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    priority   INTEGER NOT NULL DEFAULT 0,
    attempts   INTEGER NOT NULL DEFAULT 0,
    expires_at INTEGER,
    reason     TEXT    NOT NULL,
    last_error TEXT,
    dead_at    INTEGER NOT NULL,
    envelope   TEXT    NOT NULL            -- kept verbatim, even when it cannot be decoded
);

CREATE INDEX IF NOT EXISTS "switchyard_jobs_dead_queue"
    ON "switchyard_jobs_dead" (queue, dead_at);
