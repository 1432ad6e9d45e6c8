//! The handler of `work --exec`: one `sh -c CMD` per message, the envelope on its stdin,
//! its stdout the job's result and its stderr the job's log.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use switchyard::worker::{Handler, JobContext, JobError, JobResult};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::control_socket;

/// How much of a failing handler's stderr becomes `last_error` (its end, where the
/// error usually is).
const STDERR_KEPT: usize = 4 * 1024;
/// How much stdout is kept as the job's result.
const STDOUT_KEPT: usize = 1024 * 1024;

/// A run that found its lease or slots possibly overtaken before its command started:
/// it goes back without an attempt counted.
fn stale_start() -> JobError {
    JobError::Snooze {
        message: "the worker was stopped past half its lease before the command started".to_owned(),
        after: Duration::ZERO,
        rate_limited: false,
    }
}

/// Runs `sh -c CMD` per message.
#[derive(Debug)]
pub(super) struct ExecHandler {
    pub(super) command: String,
    /// Whether its stderr lines are the job's log.
    pub(super) stderr_log: bool,
    /// Where the command's `switchyard progress` and `checkpoint` reach this worker.
    pub(super) control: Option<Arc<control_socket::ControlSocket>>,
}

#[async_trait]
impl Handler for ExecHandler {
    async fn handle(&self, ctx: JobContext) -> JobResult {
        let mut cmd = self.command_for(&ctx);
        // A worker stopped past half its lease (or limit slots) may have been overtaken:
        // the command must not start then. Checked again before its input is written,
        // since a command that reads its stdin starts its work only then.
        if !ctx.is_current() {
            return Err(stale_start());
        }
        cmd.env("SWITCHYARD_CHECKPOINT", checkpoint_of(&ctx).await?);
        let (status, out, err) = self.run_command(&ctx, cmd).await?;
        if !err.is_empty() {
            // Whatever the exit: a script's warnings matter on success too.
            tracing::debug!(
                message_id = %ctx.envelope.id,
                attempt = ctx.attempt,
                stderr = %String::from_utf8_lossy(&err).trim_end(),
                "the command wrote to stderr"
            );
        }
        if status.success() {
            tracing::debug!(message_id = %ctx.envelope.id, stdout_bytes = out.len(), "command succeeded");
            if let Some(result) = result_of(&out) {
                ctx.set_result(&result)?;
            }
            return Ok(());
        }
        Err(failure(status, &out, &err))
    }
}

impl ExecHandler {
    /// `sh -c CMD` with the job in its environment, its pipes taken, in a process group
    /// of its own.
    fn command_for(&self, ctx: &JobContext) -> tokio::process::Command {
        let env = &ctx.envelope;
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c")
            .arg(&self.command)
            .env("SWITCHYARD_MESSAGE_ID", env.id.to_string())
            .env("SWITCHYARD_KIND", &env.kind)
            .env("SWITCHYARD_ATTEMPT", ctx.attempt.to_string())
            .env("SWITCHYARD_MAX_ATTEMPTS", ctx.max_attempts.to_string())
            .env("SWITCHYARD_QUEUE", env.queue.as_str())
            .env("SWITCHYARD_LEASE_TOKEN", ctx.lease_token.to_string())
            .env("SWITCHYARD_TRACE_ID", env.trace_id.as_deref().unwrap_or(""))
            .env("SWITCHYARD_LABELS", env.labels.join(","))
            .env("SWITCHYARD_TENANT", ctx.tenant().unwrap_or(""))
            .env(
                "SWITCHYARD_ORDERING_KEY",
                env.ordering_key.as_deref().unwrap_or(""),
            )
            .env(
                "SWITCHYARD_CONTROL_SOCKET",
                self.control
                    .as_ref()
                    .map(|c| c.path.as_os_str())
                    .unwrap_or_default(),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so that a timeout or shutdown kills the whole
            // command (pipelines included) and a terminal's Ctrl-C reaches only the worker.
            .process_group(0)
            .kill_on_drop(true);
        // The command's own spans continue the job's trace (W3C Trace Context).
        let (traceparent, tracestate) = switchyard::trace_context::for_command(&env.headers);
        for (name, value) in [("TRACEPARENT", traceparent), ("TRACESTATE", tracestate)] {
            match value {
                Some(v) => cmd.env(name, v),
                None => cmd.env_remove(name),
            };
        }
        cmd
    }

    /// Starts the command, feeds it the envelope and waits for its exit (or for the
    /// worker's stop, passed on as SIGTERM): its status, stdout and stderr's tail.
    async fn run_command(
        &self,
        ctx: &JobContext,
        mut cmd: tokio::process::Command,
    ) -> Result<(std::process::ExitStatus, Vec<u8>, Vec<u8>), JobError> {
        // The command's reports are taken while it runs, under this lease.
        let _registered = self.control.as_ref().map(|c| c.register(ctx));
        let mut child = cmd
            .spawn()
            .map_err(|e| JobError::retry(format!("cannot start `sh -c {}`: {e}", self.command)))?;
        let group = child.id().map(KillGroupOnDrop);
        let body = ctx.envelope.to_json();
        let stdin = child.stdin.take();
        if !ctx.is_current() {
            drop(group);
            return Err(stale_start());
        }
        let feed = async move {
            if let Some(mut stdin) = stdin {
                // A command that does not read its stdin closes the pipe early: not an error.
                let _ = stdin.write_all(body.as_bytes()).await;
                let _ = stdin.shutdown().await;
            }
        };
        let out_task = tokio::spawn(read_tail(child.stdout.take(), STDOUT_KEPT, |_| {}));
        // Its stderr lines are the job's log as they come.
        let mut lines = LogLines::new(self.stderr_log.then(|| ctx.clone()));
        let err_task = tokio::spawn(read_tail(child.stderr.take(), STDERR_KEPT, move |chunk| {
            lines.feed(chunk)
        }));
        tokio::spawn(feed);
        // The job ends when the command exits, not when its pipes close: a background
        // process it left behind may hold them open.
        let status = tokio::select! {
            status = child.wait() => status,
            _ = ctx.cancel.cancelled() => {
                // Asked to stop: SIGTERM first; the worker aborts (SIGKILL) shortly after.
                if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                }
                child.wait().await
            }
        };
        let status =
            status.map_err(|e| JobError::retry(format!("waiting for the command failed: {e}")))?;
        let pipes = Duration::from_millis(200);
        let out = match tokio::time::timeout(pipes, out_task).await {
            Ok(Ok(out)) => out,
            _ => Vec::new(),
        };
        let err = match tokio::time::timeout(pipes, err_task).await {
            Ok(Ok(err)) => err,
            _ => Vec::new(),
        };
        // Background processes the command left in its group end with it.
        drop(group);
        Ok((status, out, err))
    }
}

/// The job's checkpoint for `SWITCHYARD_CHECKPOINT`: empty where the worker keeps none.
async fn checkpoint_of(ctx: &JobContext) -> Result<String, JobError> {
    // A read that fails would start the command from zero: the job waits instead.
    match ctx.checkpoint_json().await {
        Ok(value) => Ok(value.unwrap_or_default()),
        Err(switchyard::Error::NotSupported(_)) => Ok(String::new()),
        Err(e) => Err(JobError::retry(format!(
            "cannot read the job's checkpoint: {e}"
        ))),
    }
}

/// What a command's failed exit means: a wait (`EX_TEMPFAIL`) or a retry, after its
/// `Retry-After` when it printed one, with its stderr as the error.
fn failure(status: std::process::ExitStatus, out: &[u8], err: &[u8]) -> JobError {
    let how = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => "failed".to_owned(),
    };
    let retry_after = retry_after_of(out);
    if status.code() == Some(EX_TEMPFAIL) {
        // "Try again later": a wait, not a failure.
        return match retry_after {
            Some(after) => JobError::rate_limited(after),
            None => JobError::snooze(TEMPFAIL_WAIT),
        };
    }
    let stderr = String::from_utf8_lossy(err);
    let stderr = stderr.trim();
    let message = if stderr.is_empty() {
        format!("command {how}")
    } else {
        format!("command {how}: {stderr}")
    };
    match retry_after {
        Some(after) => JobError::retry_after(after, message),
        None => JobError::retry(message),
    }
}

/// The exit code that asks to come back later without counting an attempt
/// (`EX_TEMPFAIL` of sysexits.h).
const EX_TEMPFAIL: i32 = 75;

/// How long a command that exits [`EX_TEMPFAIL`] without a `Retry-After` line waits.
const TEMPFAIL_WAIT: Duration = Duration::from_secs(5);

/// The wait a command asks for with a `Retry-After: N` line on stdout (seconds, as in
/// HTTP, or a duration such as `500ms`); the last such line counts. A line that does
/// not parse is ignored, with a warning.
fn retry_after_of(stdout: &[u8]) -> Option<Duration> {
    let text = String::from_utf8_lossy(stdout);
    let value = text.lines().rev().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("retry-after")
            .then(|| value.trim().to_owned())
    })?;
    let parsed = match value.parse::<u64>() {
        Ok(secs) => Ok(Duration::from_secs(secs)),
        Err(_) => switchyard::parse_duration("Retry-After", &value).map_err(|e| e.to_string()),
    };
    match parsed {
        Ok(d) if d <= MAX_RETRY_AFTER => Some(d),
        Ok(d) => {
            tracing::warn!(retry_after = ?d, "the command's Retry-After is over a day; waiting a day");
            Some(MAX_RETRY_AFTER)
        }
        Err(why) => {
            tracing::warn!(value = %value, %why, "the command's Retry-After line is not seconds or a duration; ignored");
            None
        }
    }
}

/// The longest wait a command's `Retry-After` can ask for.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// The job's result from the command's stdout: its JSON, or else its text as a JSON
/// string; nothing for empty output.
fn result_of(stdout: &[u8]) -> Option<serde_json::Value> {
    let text = String::from_utf8_lossy(stdout);
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    Some(serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_owned())))
}

/// Kills the command's whole process group when the job ends: at once if the handler is
/// dropped before the command exits (timeout, lost lease, shutdown past the grace
/// period), and afterwards any background process the command left behind.
struct KillGroupOnDrop(u32);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.0) {
            if pid > 0 {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

/// A command's output, line by line, into its job's log; a line without its end yet
/// waits for it (a long one goes in parts), and the last is logged when the pipe ends.
struct LogLines {
    ctx: Option<JobContext>,
    partial: Vec<u8>,
}

impl LogLines {
    fn new(ctx: Option<JobContext>) -> Self {
        LogLines {
            ctx,
            partial: Vec::new(),
        }
    }

    fn feed(&mut self, chunk: &[u8]) {
        let Some(ctx) = &self.ctx else {
            return;
        };
        self.partial.extend_from_slice(chunk);
        if let Some(end) = self.partial.iter().rposition(|b| *b == b'\n') {
            let done: Vec<u8> = self.partial.drain(..=end).collect();
            ctx.log(String::from_utf8_lossy(&done));
        }
        if self.partial.len() > switchyard::job_log::MAX_LOG_LINE {
            // At a character's end, so that none is cut in two.
            let upto = match std::str::from_utf8(&self.partial) {
                Ok(_) => self.partial.len(),
                Err(e) if e.valid_up_to() > 0 => e.valid_up_to(),
                Err(_) => self.partial.len(),
            };
            let part: Vec<u8> = self.partial.drain(..upto).collect();
            ctx.log(String::from_utf8_lossy(&part));
        }
    }
}

impl Drop for LogLines {
    fn drop(&mut self) {
        if let (Some(ctx), false) = (&self.ctx, self.partial.is_empty()) {
            ctx.log(String::from_utf8_lossy(&self.partial));
        }
    }
}

/// Reads a pipe to its end, keeping only the last `limit` bytes, so a chatty command
/// neither blocks on a full pipe nor fills the worker's memory; each chunk read goes to
/// `sink` as well.
async fn read_tail(
    pipe: Option<impl AsyncRead + Unpin>,
    limit: usize,
    mut sink: impl FnMut(&[u8]),
) -> Vec<u8> {
    let Some(mut pipe) = pipe else {
        return Vec::new();
    };
    let mut kept: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    let mut truncated = false;
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                sink(&chunk[..n]);
                kept.extend_from_slice(&chunk[..n]);
                if kept.len() > limit * 2 {
                    kept.drain(..kept.len() - limit);
                    truncated = true;
                }
            }
        }
    }
    if kept.len() > limit {
        kept.drain(..kept.len() - limit);
        truncated = true;
    }
    if truncated {
        let mut marked = b"...".to_vec();
        marked.extend_from_slice(&kept);
        return marked;
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_lines_are_seconds_or_durations() {
        assert_eq!(
            retry_after_of(b"Retry-After: 30\n"),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after_of(b"calling\nretry-after:500ms\n"),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            retry_after_of(b"Retry-After: 1\nRetry-After: 2\n"),
            Some(Duration::from_secs(2)),
            "the last line counts"
        );
        assert_eq!(retry_after_of(b"Retry-After: soon\n"), None);
        assert_eq!(retry_after_of(b"no header\n"), None);
        assert_eq!(
            retry_after_of(b"Retry-After: 999999\n"),
            Some(MAX_RETRY_AFTER)
        );
    }

    #[test]
    fn stdout_becomes_json_or_text() {
        assert_eq!(result_of(b""), None);
        assert_eq!(result_of(b" \n"), None);
        assert_eq!(
            result_of(b"{\"ok\": true}\n"),
            Some(serde_json::json!({"ok": true}))
        );
        assert_eq!(result_of(b"done\n"), Some(serde_json::json!("done")));
    }

    #[tokio::test]
    async fn read_tail_keeps_the_end_of_long_output() {
        let data: Vec<u8> = (0..100_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let kept = read_tail(Some(&data[..]), 1000, |_| {}).await;
        assert!(kept.starts_with(b"..."));
        assert_eq!(&kept[3..], &data[data.len() - 1000..]);
        let short = read_tail(Some(&b"short"[..]), 1000, |_| {}).await;
        assert_eq!(short, b"short");
    }
}
