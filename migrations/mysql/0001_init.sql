-- Switchyard on MySQL 8.0+ / MariaDB 10.6+, schema version 1.
--
-- Plain SQL for the default table name `switchyard_jobs`; the transport applies it with
-- every occurrence of `switchyard_jobs` replaced by the configured, validated QUEUE_TABLE
-- (and `QUEUE_SCHEMA`.`…` when a schema, MySQL's database, is configured). Index names
-- are scoped to their table in MySQL, so they are short and fixed: a 57-character table
-- name cannot push them past the 64-character limit.
--
-- InnoDB, utf8mb4 with binary collation (ids and queue names compare byte for byte).
-- Times are integer microseconds since the epoch from the server's clock, so ordering
-- and leases are exact.

CREATE TABLE IF NOT EXISTS `switchyard_jobs` (
    seq          BIGINT       NOT NULL AUTO_INCREMENT, -- publish order, the FIFO tie-breaker
    id           VARCHAR(191) NOT NULL,                -- envelope id; text so a foreign row can be quarantined
    queue        VARCHAR(191) NOT NULL,
    kind         VARCHAR(255) NOT NULL,
    priority     INT          NOT NULL DEFAULT 0,
    prio_rank    INT          NOT NULL DEFAULT 0,      -- -priority: the claim index walks it ascending (no DESC indexes before MariaDB 10.8)
    attempts     INT          NOT NULL DEFAULT 0,
    ready        TINYINT      NOT NULL DEFAULT 0,      -- 1: due and free; 0: delayed or leased
    started      TINYINT      NOT NULL DEFAULT 0,      -- a handler began the current lease
    available_at BIGINT       NOT NULL,                -- due time
    visible_at   BIGINT       NOT NULL,                -- claimable from: due time, or lease end
    expires_at   BIGINT       NULL,
    token        CHAR(36)     NULL,                    -- lease token; NULL when free
    reserved_at  BIGINT       NULL,
    last_error   TEXT         NULL,
    created_at   BIGINT       NOT NULL,
    envelope     LONGTEXT     NOT NULL,                -- the v1 envelope JSON as published
    PRIMARY KEY (seq),
    UNIQUE KEY id_key (id),
    -- The claim walks this index in delivery order (ready rows of one queue first).
    KEY claim_idx (queue, ready, prio_rank, visible_at, seq),
    -- Waiting rows by the time they become claimable, for promotion.
    KEY due_idx (ready, visible_at),
    KEY expiry_idx (expires_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS `switchyard_jobs_dead` (
    id         VARCHAR(191) NOT NULL,
    queue      VARCHAR(191) NOT NULL,
    kind       VARCHAR(255) NOT NULL,
    priority   INT          NOT NULL DEFAULT 0,
    attempts   INT          NOT NULL DEFAULT 0,
    expires_at BIGINT       NULL,
    reason     VARCHAR(64)  NOT NULL,
    last_error TEXT         NULL,
    dead_at    BIGINT       NOT NULL,
    envelope   LONGTEXT     NOT NULL,                  -- kept verbatim, even when it cannot be decoded
    PRIMARY KEY (id),
    KEY queue_idx (queue, dead_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
