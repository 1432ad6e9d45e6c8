//! The SQL dialects that statements shared by the SQL backends are written once for,
//! and how such a statement is put into each.

/// The SQL dialects of the statements the backends share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// PostgreSQL: `$n` parameters, the server's clock in µs written out.
    Postgres,
    /// MySQL and MariaDB: backquoted names; `{NOW}` left for the backend.
    MySql,
    /// SQLite: no row locks (the write lock serialises); `{NOW}` left for the backend.
    Sqlite,
}

/// PostgreSQL's clock in µs since the epoch.
const PG_NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint";

impl Dialect {
    /// `sql`, written with `?` parameters, double-quoted names and the placeholders
    /// `{IGNORE}`, `{NOTHING}` (an insert that keeps an existing row), `{FOR_UPDATE}`,
    /// `{UPSERT}` (of a limit holder) and `{NOW_I64}` (the clock when a locked row is
    /// read, as an integer), in this dialect; `{NOW}` is left
    /// for MySQL's and SQLite's own specialisation.
    pub fn write(self, sql: &str) -> String {
        let (ignore, nothing, for_update, upsert, now_i64) = match self {
            Dialect::Postgres => (
                "",
                " ON CONFLICT DO NOTHING",
                " FOR UPDATE",
                " ON CONFLICT (queue, limit_key, id) DO UPDATE SET token = excluded.token, \
                 run_at = excluded.run_at, held_until = excluded.held_until",
                "{NOW}",
            ),
            Dialect::MySql => (
                "IGNORE ",
                "",
                " FOR UPDATE",
                " ON DUPLICATE KEY UPDATE token = VALUES(token), run_at = VALUES(run_at), \
                 held_until = VALUES(held_until)",
                // The time the row was read, after any wait for its lock: `NOW()` is the
                // statement's start, which a wait behind a long transaction leaves
                // behind, and a bucket refilled by a stale clock runs ahead of its rate.
                "CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)",
            ),
            Dialect::Sqlite => (
                "",
                " ON CONFLICT DO NOTHING",
                "",
                " ON CONFLICT (queue, limit_key, id) DO UPDATE SET token = excluded.token, \
                 run_at = excluded.run_at, held_until = excluded.held_until",
                "{NOW}",
            ),
        };
        let sql = sql
            .replace("{IGNORE}", ignore)
            .replace("{NOTHING}", nothing)
            .replace("{FOR_UPDATE}", for_update)
            .replace("{UPSERT}", upsert)
            .replace("{NOW_I64}", now_i64);
        match self {
            Dialect::Postgres => numbered(&sql.replace("{NOW}", PG_NOW)),
            Dialect::MySql => sql.replace('"', "`"),
            Dialect::Sqlite => sql,
        }
    }
}

/// `?` placeholders numbered `$1`, `$2`, … (the statements hold no `?` in literals).
fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(c);
        }
    }
    out
}
