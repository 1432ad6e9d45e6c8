//! Limits: at most so many jobs running at once, or starting per period, per queue, per
//! kind, or per key (a header or a payload field, such as a tenant or an account).
//!
//! A worker declares its limits ([`Worker::limit`](crate::worker::Worker::limit), `work
//! --limit`); they are enforced across every worker and process that declares them,
//! through a [`LimitStore`](crate::LimitStore) (the SQL store beside the jobs, or the
//! control store beside RabbitMQ). A job takes its slots and tokens as it starts, under
//! its lease: the slot is held while the lease is, renewed by a heartbeat, and freed by
//! that lease's ack, release or dead letter, or when the lease runs out. A stale worker's
//! free names a lease that no longer holds the slot, so it frees nothing. A job that
//! finds a limit reached goes back to its queue without running and without counting an
//! attempt: for a rate, until its booked start (a snooze); for a slot, parked out of the
//! claim order until the release of a slot of its key wakes it, where the store sits
//! beside the jobs ([`Capabilities::limit_parking`](crate::Capabilities::limit_parking);
//! a snooze of half a second to a second elsewhere).

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::envelope::Envelope;
use crate::error::{Error, Result};

/// Bytes in a limit key (its value part is cut to fit).
pub const MAX_LIMIT_KEY_LEN: usize = 191;

/// What a limit counts by: each distinct value has its own slots and tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitBy {
    /// The whole queue.
    Queue,
    /// The job's kind.
    Kind,
    /// The value of a header (such as `tenant`); a job without it is not limited.
    Header(String),
    /// The value of a field of a JSON payload, named by a JSON pointer (`/account_id`);
    /// a job without it (or without a JSON payload) is not limited.
    Field(String),
}

/// A token bucket: `count` starts per `per`, and up to `burst` at once after a quiet
/// spell.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Rate {
    /// Starts per period.
    pub count: u32,
    /// The period.
    #[serde(serialize_with = "millis")]
    pub per: Duration,
    /// The bucket's size: starts allowed at once.
    pub burst: u32,
}

impl Rate {
    /// Tokens added per µs.
    pub fn per_micro(&self) -> f64 {
        f64::from(self.count) / (self.per.as_secs_f64() * 1_000_000.0)
    }
}

/// One limit a worker enforces (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    by: LimitBy,
    kind: Option<String>,
    concurrency: Option<u32>,
    rate: Option<Rate>,
}

impl Limit {
    fn by(by: LimitBy) -> Self {
        Limit {
            by,
            kind: None,
            concurrency: None,
            rate: None,
        }
    }

    /// Counts over the whole queue.
    pub fn per_queue() -> Self {
        Self::by(LimitBy::Queue)
    }

    /// Counts per kind.
    pub fn per_kind() -> Self {
        Self::by(LimitBy::Kind)
    }

    /// Counts per value of header `name`.
    pub fn per_header(name: impl Into<String>) -> Self {
        Self::by(LimitBy::Header(name.into()))
    }

    /// Counts per value of the payload field at JSON pointer `pointer` (`/account_id`).
    pub fn per_field(pointer: impl Into<String>) -> Self {
        Self::by(LimitBy::Field(pointer.into()))
    }

    /// Applies only to jobs of `kind`.
    pub fn only_kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// At most `n` running at once (at least 1).
    pub fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = Some(n.max(1));
        self
    }

    /// Whether it limits how many run at once.
    pub(crate) fn has_concurrency(&self) -> bool {
        self.concurrency.is_some()
    }

    /// At most `count` starts per `per`, `count` of them at once (set
    /// [`burst`](Self::burst) after this to change that).
    pub fn rate(mut self, count: u32, per: Duration) -> Self {
        let count = count.max(1);
        self.rate = Some(Rate {
            count,
            per: per.max(Duration::from_millis(1)),
            burst: count,
        });
        self
    }

    /// The rate's bucket size: starts allowed at once after a quiet spell (at least 1).
    pub fn burst(mut self, burst: u32) -> Self {
        if let Some(rate) = &mut self.rate {
            rate.burst = burst.max(1);
        }
        self
    }

    /// The concurrency, if limited.
    pub fn max_running(&self) -> Option<u32> {
        self.concurrency
    }

    /// The rate, if limited.
    pub fn max_rate(&self) -> Option<Rate> {
        self.rate
    }

    /// What it counts by.
    pub fn counted_by(&self) -> &LimitBy {
        &self.by
    }

    /// Checks that it limits something and that its pointer is one.
    pub fn check(&self) -> Result<()> {
        if self.concurrency.is_none() && self.rate.is_none() {
            return Err(Error::InvalidInput(format!(
                "limit {self} sets neither a concurrency nor a rate"
            )));
        }
        match &self.by {
            LimitBy::Field(p) if !p.starts_with('/') => Err(Error::InvalidInput(format!(
                "limit field {p:?} is not a JSON pointer: write it as /name or /outer/inner"
            ))),
            LimitBy::Header(h) if h.is_empty() => {
                Err(Error::InvalidInput("limit header name is empty".to_owned()))
            }
            _ if self.kind.as_deref() == Some("") => Err(Error::InvalidInput(format!(
                "limit {self} names an empty kind: give kind=NAME or leave it out"
            ))),
            _ => Ok(()),
        }
    }

    /// The key `env` counts under, or `None` when the limit does not apply to it.
    pub fn key_of(&self, env: &Envelope) -> Option<String> {
        if self.kind.as_ref().is_some_and(|k| *k != env.kind) {
            return None;
        }
        let key = match &self.by {
            LimitBy::Queue => "queue".to_owned(),
            LimitBy::Kind => format!("kind:{}", env.kind),
            LimitBy::Header(name) => format!("header:{name}={}", env.headers.get(name)?),
            LimitBy::Field(pointer) => {
                let payload: serde_json::Value = serde_json::from_str(env.payload.get()).ok()?;
                let value = match payload.pointer(pointer)? {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Null => return None,
                    other => other.to_string(),
                };
                format!("field:{pointer}={value}")
            }
        };
        // A kind-only limit counts apart from a limit of the same key for all kinds.
        let key = match &self.kind {
            Some(kind) => format!("{kind}/{key}"),
            None => key,
        };
        Some(cut(key))
    }

    /// What a job needs of this limit under `key`.
    pub fn want(&self, key: String) -> Want {
        Want {
            key,
            concurrency: self.concurrency,
            rate: self.rate,
        }
    }

    /// Parses the command line's form: `BY[:NAME][,kind=K],concurrency=N,rate=N/PERIOD
    /// [,burst=N]`, where BY is `queue`, `kind`, `header:NAME` or `field:/POINTER` and
    /// PERIOD is `s`, `m`, `h` or a duration such as `10s`.
    pub fn parse(spec: &str) -> Result<Self> {
        let bad = |why: String| {
            Error::InvalidInput(format!(
                "limit {spec:?}: {why}; accepted: BY[,kind=K][,concurrency=N][,rate=N/PERIOD][,burst=N] \
                 with BY one of queue, kind, header:NAME, field:/POINTER (e.g. header:tenant,concurrency=2 \
                 or queue,rate=50/s,burst=10)"
            ))
        };
        let mut parts = spec.split(',').map(str::trim);
        let by = match parts.next().unwrap_or_default() {
            "queue" => LimitBy::Queue,
            "kind" => LimitBy::Kind,
            other => match other.split_once(':') {
                Some(("header", name)) if !name.is_empty() => LimitBy::Header(name.to_owned()),
                Some(("field", pointer)) => LimitBy::Field(pointer.to_owned()),
                _ => return Err(bad(format!("{other:?} is not what a limit counts by"))),
            },
        };
        let mut limit = Self::by(by);
        let mut burst = None;
        for part in parts {
            let (name, value) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("{part:?} is not NAME=VALUE")))?;
            let number = |v: &str| {
                v.parse::<u32>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad(format!("{name}={v:?} is not a whole number above 0")))
            };
            match name {
                "kind" => limit.kind = Some(value.to_owned()),
                "concurrency" => limit.concurrency = Some(number(value)?),
                "burst" => burst = Some(number(value)?),
                "rate" => {
                    let (count, per) = value
                        .split_once('/')
                        .ok_or_else(|| bad(format!("rate={value:?} is not N/PERIOD")))?;
                    let per = match per {
                        "s" => Duration::from_secs(1),
                        "m" => Duration::from_secs(60),
                        "h" => Duration::from_secs(3600),
                        other => humantime::parse_duration(other).map_err(|_| {
                            bad(format!(
                                "rate period {other:?} is not s, m, h or a duration"
                            ))
                        })?,
                    };
                    limit = limit.rate(number(count)?, per);
                }
                other => return Err(bad(format!("{other:?} is not a limit setting"))),
            }
        }
        if let Some(b) = burst {
            if limit.rate.is_none() {
                return Err(bad("burst without a rate".to_owned()));
            }
            limit = limit.burst(b);
        }
        limit.check().map_err(|e| bad(e.to_string()))?;
        Ok(limit)
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.by {
            LimitBy::Queue => f.write_str("queue")?,
            LimitBy::Kind => f.write_str("kind")?,
            LimitBy::Header(h) => write!(f, "header:{h}")?,
            LimitBy::Field(p) => write!(f, "field:{p}")?,
        }
        if let Some(kind) = &self.kind {
            write!(f, ",kind={kind}")?;
        }
        if let Some(n) = self.concurrency {
            write!(f, ",concurrency={n}")?;
        }
        if let Some(r) = &self.rate {
            write!(f, ",rate={}/{:?},burst={}", r.count, r.per, r.burst)?;
        }
        Ok(())
    }
}

/// What one job needs under one key: a slot, a token, or both.
#[derive(Debug, Clone, PartialEq)]
pub struct Want {
    /// The key, per queue.
    pub key: String,
    /// Slots of the key, if limited.
    pub concurrency: Option<u32>,
    /// The key's bucket, if limited.
    pub rate: Option<Rate>,
}

/// Whether a job may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// It holds its slots and tokens: it runs.
    Granted,
    /// A limit is reached: back in the queue for this long, then try again.
    Wait {
        /// How long.
        after: Duration,
        /// Which kind of limit said no.
        by: Denial,
    },
}

/// Which kind of limit kept a job from starting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// All slots are taken.
    Concurrency,
    /// The bucket is empty.
    Rate,
}

impl Denial {
    /// Its name in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Denial::Concurrency => "concurrency",
            Denial::Rate => "rate",
        }
    }
}

/// One key's use, for `stats` and the dashboard.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitUsage {
    /// The queue.
    pub queue: String,
    /// The key.
    pub key: String,
    /// Slots, as last declared by a worker.
    pub concurrency: Option<u32>,
    /// Slots held by live leases.
    pub running: u64,
    /// Starts per second, as last declared by a worker.
    pub rate_per_second: Option<f64>,
    /// Tokens in the bucket when it was last used (negative: starts booked ahead).
    pub tokens: Option<f64>,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_u128(d.as_millis())
}

fn cut(mut key: String) -> String {
    if key.len() > MAX_LIMIT_KEY_LEN {
        let mut end = MAX_LIMIT_KEY_LEN;
        while !key.is_char_boundary(end) {
            end -= 1;
        }
        key.truncate(end);
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_command_line_form() {
        let l = Limit::parse("header:tenant,concurrency=2").unwrap();
        assert_eq!(l, Limit::per_header("tenant").concurrency(2));
        let l = Limit::parse("queue,rate=50/s,burst=5").unwrap();
        assert_eq!(
            l,
            Limit::per_queue().rate(50, Duration::from_secs(1)).burst(5)
        );
        let l = Limit::parse("field:/account,kind=sync,rate=10/1m").unwrap();
        assert_eq!(
            l,
            Limit::per_field("/account")
                .only_kind("sync")
                .rate(10, Duration::from_secs(60))
        );
        for bad in [
            "",
            "queue",
            "tenant,concurrency=2",
            "queue,concurrency=0",
            "queue,rate=5",
            "queue,burst=3",
            "field:account,concurrency=1",
            "queue,speed=3",
        ] {
            let err = Limit::parse(bad).unwrap_err().to_string();
            assert!(err.contains("accepted:"), "{bad}: {err}");
        }
    }

    #[test]
    fn keys_come_from_the_job() {
        let env = Envelope::builder("q", "sync")
            .header("tenant", "t1")
            .payload(&serde_json::json!({"account": 42, "name": "x"}))
            .build()
            .unwrap();
        assert_eq!(Limit::per_queue().key_of(&env).as_deref(), Some("queue"));
        assert_eq!(Limit::per_kind().key_of(&env).as_deref(), Some("kind:sync"));
        assert_eq!(
            Limit::per_header("tenant").key_of(&env).as_deref(),
            Some("header:tenant=t1")
        );
        assert_eq!(
            Limit::per_field("/account").key_of(&env).as_deref(),
            Some("field:/account=42")
        );
        assert_eq!(Limit::per_header("region").key_of(&env), None);
        assert_eq!(Limit::per_queue().only_kind("other").key_of(&env), None);
        assert_eq!(
            Limit::per_queue().only_kind("sync").key_of(&env).as_deref(),
            Some("sync/queue")
        );
    }
}
