//! `switchyard progress PERCENT [NOTE]` and `switchyard checkpoint VALUE`: run by an
//! exec command, they report to the worker running it (over
//! `SWITCHYARD_CONTROL_SOCKET`), which records them as a library handler's
//! `ctx.progress` and `ctx.checkpoint` do.

use std::time::Duration;

use switchyard::checkpoint::MAX_CHECKPOINT_BYTES;
use switchyard::{Error, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::cli::{CheckpointArgs, ProgressArgs};
use crate::control_protocol::{Reply, Request, MAX_LINE};

/// How long the worker may take to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// A variable the worker sets for its command.
fn var(name: &str) -> Result<String> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            Error::InvalidInput(format!(
                "{name} is not set: `switchyard progress` and `switchyard checkpoint` are run by a command of `switchyard work --exec`, which sets it"
            ))
        })
}

pub(crate) async fn progress(args: ProgressArgs) -> Result<()> {
    let (socket, mut request) = job_request()?;
    request.progress = Some(args.percent);
    request.note = args.note;
    send(&socket, &request).await
}

pub(crate) async fn checkpoint(args: CheckpointArgs) -> Result<()> {
    let value = if args.value == "-" {
        let mut text = String::new();
        tokio::io::stdin()
            .take(MAX_CHECKPOINT_BYTES as u64 + 1)
            .read_to_string(&mut text)
            .await
            .map_err(|source| Error::Io {
                what: "reading the checkpoint from stdin".into(),
                source,
            })?;
        text
    } else {
        args.value
    };
    let value = value.trim();
    switchyard::checkpoint::check_size(value)?;
    serde_json::from_str::<serde::de::IgnoredAny>(value).map_err(|e| {
        Error::InvalidInput(format!(
            "a checkpoint must be JSON (an object, a number, a quoted string): {e}"
        ))
    })?;
    let (socket, mut request) = job_request()?;
    request.checkpoint = Some(value.to_owned());
    send(&socket, &request).await
}

/// The worker's socket, and a request naming the job this command runs for, from its
/// environment.
fn job_request() -> Result<(String, Request)> {
    let socket = var("SWITCHYARD_CONTROL_SOCKET")?;
    let id = var("SWITCHYARD_MESSAGE_ID")?;
    let id = uuid::Uuid::parse_str(&id).map_err(|e| {
        Error::InvalidInput(format!("SWITCHYARD_MESSAGE_ID {id:?} is not a job id: {e}"))
    })?;
    let request = Request {
        id,
        token: var("SWITCHYARD_LEASE_TOKEN")?,
        tenant: std::env::var("SWITCHYARD_TENANT")
            .ok()
            .filter(|t| !t.is_empty()),
        progress: None,
        note: None,
        checkpoint: None,
    };
    Ok((socket, request))
}

/// Sends `request` to the worker, waiting at most [`ANSWER_WITHIN`] for its answer.
async fn send(socket: &str, request: &Request) -> Result<()> {
    match tokio::time::timeout(ANSWER_WITHIN, talk(socket, request)).await {
        Ok(answer) => answer,
        Err(_) => Err(Error::Conflict(format!(
            "the worker did not answer within {} s on {socket}",
            ANSWER_WITHIN.as_secs()
        ))),
    }
}

/// Sends the request and reads the answer.
async fn talk(socket: &str, request: &Request) -> Result<()> {
    let io = |what: &str| {
        let what = format!("{what} the worker's control socket {socket}");
        move |source| Error::Io { what, source }
    };
    let stream = UnixStream::connect(socket)
        .await
        .map_err(io("connecting to"))?;
    let (read, mut write) = stream.into_split();
    let mut line = serde_json::to_string(request)
        .map_err(|e| Error::InvalidInput(format!("cannot encode the request: {e}")))?;
    line.push('\n');
    write
        .write_all(line.as_bytes())
        .await
        .map_err(io("writing to"))?;
    let mut answer = String::new();
    BufReader::new(read)
        .take(MAX_LINE)
        .read_line(&mut answer)
        .await
        .map_err(io("reading from"))?;
    let reply: Reply = serde_json::from_str(&answer).map_err(|e| {
        Error::InvalidInput(format!("the worker answered {answer:?}, not a reply: {e}"))
    })?;
    match (reply.ok, reply.error) {
        (true, _) => Ok(()),
        (false, why) => Err(Error::Conflict(
            why.unwrap_or_else(|| "the worker refused the report".into()),
        )),
    }
}
