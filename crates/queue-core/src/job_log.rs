//! Per-job logs: the last lines a handler wrote with `ctx.log` (an exec command: its
//! stderr), kept with the job, one entry per attempt, so that `switchyard job ID` and
//! the dashboard show what a run said without a log search.
//!
//! Size-capped: each attempt keeps its last [`MAX_LOG_BYTES`] (a line is cut at
//! [`MAX_LOG_LINE`], NUL bytes dropped). Written within a second of a line while the
//! job runs, one write at a time, and when it ends; kept after it completes, and pruned
//! with finished status by age. Not fenced: a run that lost its lease may still write
//! its own attempt's lines, which is what happened.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::error::Result;

/// The most of one attempt's log kept, in bytes: its last lines.
pub const MAX_LOG_BYTES: usize = 16 * 1024;

/// The longest line kept, in bytes; a longer one is cut.
pub const MAX_LOG_LINE: usize = 1024;

/// One attempt's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogEntry {
    /// The attempt that wrote it.
    pub attempt: u32,
    /// Its last lines, newline-separated.
    pub lines: String,
    /// When it was last written (by the worker's clock).
    pub updated_at: DateTime<Utc>,
}

/// Where job logs are kept (see the [module docs](self)).
#[async_trait]
pub trait JobLogStore: Send + Sync + fmt::Debug {
    /// Stores `lines` as attempt `attempt`'s log of job `id` (replacing what that attempt
    /// wrote before), at `now` (µs since the epoch).
    async fn put(&self, id: Uuid, attempt: u32, lines: &str, now: i64) -> Result<()>;

    /// Job `id`'s logs, oldest attempt first.
    async fn get(&self, id: Uuid) -> Result<Vec<LogEntry>>;

    /// Removes the logs last written before `before` (µs since the epoch); how many.
    async fn prune(&self, before: i64) -> Result<u64>;
}

/// One run's log: its last lines, written to the store when they changed.
#[derive(Debug, Clone)]
pub(crate) struct JobLog {
    store: Arc<dyn JobLogStore>,
    id: Uuid,
    attempt: u32,
    tail: Arc<Mutex<Tail>>,
    /// Held across a write, so that writes land in the order their lines were taken.
    writing: Arc<tokio::sync::Mutex<()>>,
}

#[derive(Debug, Default)]
struct Tail {
    lines: VecDeque<String>,
    bytes: usize,
    dropped: u64,
    /// Lines came since the last write.
    dirty: bool,
    /// A write is on its way: lines that come meanwhile go with the next.
    pending: bool,
    last_write: Option<Instant>,
}

/// The least time between two writes of one run's lines.
const WRITE_EVERY: Duration = Duration::from_secs(1);

impl JobLog {
    pub(crate) fn new(store: Arc<dyn JobLogStore>, id: Uuid, attempt: u32) -> Self {
        JobLog {
            store,
            id,
            attempt,
            tail: Arc::default(),
            writing: Arc::default(),
        }
    }

    /// Adds a line (several, when it holds newlines), keeping the last
    /// [`MAX_LOG_BYTES`], and has them written within [`WRITE_EVERY`] (at once after a
    /// quiet spell).
    pub(crate) fn push(&self, text: &str) {
        // Outside a runtime the lines wait for the run's end.
        let runtime = tokio::runtime::Handle::try_current().ok();
        let wait = {
            let Ok(mut tail) = self.tail.lock() else {
                return;
            };
            tail.push(text);
            if tail.pending || runtime.is_none() {
                return;
            }
            tail.pending = true;
            tail.last_write.map_or(Duration::ZERO, |at| {
                WRITE_EVERY.saturating_sub(at.elapsed())
            })
        };
        let Some(runtime) = runtime else {
            return;
        };
        let log = self.clone();
        runtime.spawn(async move {
            tokio::time::sleep(wait).await;
            log.flush().await;
        });
    }

    /// Writes the lines if they changed since the last write; a failure is logged and
    /// left to the next write.
    pub(crate) async fn flush(&self) {
        let _one_at_a_time = self.writing.lock().await;
        let text = {
            let Ok(mut tail) = self.tail.lock() else {
                return;
            };
            tail.pending = false;
            if !tail.dirty {
                return;
            }
            tail.dirty = false;
            tail.last_write = Some(Instant::now());
            render(&tail)
        };
        let now = Utc::now().timestamp_micros();
        if let Err(err) = self.store.put(self.id, self.attempt, &text, now).await {
            if let Ok(mut tail) = self.tail.lock() {
                tail.dirty = true;
            }
            tracing::warn!(message_id = %self.id, error = %err, "could not store the job's log lines; retrying with the next");
        }
    }
}

impl Tail {
    fn push(&mut self, text: &str) {
        for line in text.lines() {
            let line = cut(line);
            self.bytes += line.len() + 1;
            self.lines.push_back(line);
            while self.bytes > MAX_LOG_BYTES {
                let Some(old) = self.lines.pop_front() else {
                    break;
                };
                self.bytes -= old.len() + 1;
                self.dropped += 1;
            }
        }
        self.dirty = true;
    }
}

/// `line` without NUL bytes (which PostgreSQL's text refuses), cut to
/// [`MAX_LOG_LINE`] bytes at a character boundary.
fn cut(line: &str) -> String {
    let line = line.replace('\0', "");
    if line.len() <= MAX_LOG_LINE {
        return line;
    }
    let mut end = MAX_LOG_LINE;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

fn render(tail: &Tail) -> String {
    let mut text = String::with_capacity(tail.bytes + 40);
    if tail.dropped > 0 {
        text.push_str(&format!("… {} earlier lines dropped\n", tail.dropped));
    }
    for line in &tail.lines {
        text.push_str(line);
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_last_lines_and_says_how_many_went() {
        let mut tail = Tail::default();
        for n in 0..10_000 {
            tail.push(&format!("line {n}"));
        }
        tail.push("two\nlines");
        assert_eq!(tail.lines.back().map(String::as_str), Some("lines"));
        let text = render(&tail);
        assert!(text.len() <= MAX_LOG_BYTES + 40, "{}", text.len());
        assert!(text.ends_with("line 9999\ntwo\nlines\n"));
        assert!(text.starts_with(&format!("… {} earlier lines dropped\n", tail.dropped)));
        let long = "é".repeat(MAX_LOG_LINE);
        let kept = cut(&long);
        assert!(kept.len() <= MAX_LOG_LINE + 3 && kept.ends_with('…'));
        assert_eq!(cut("a\0b"), "ab");
    }
}
