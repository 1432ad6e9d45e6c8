//! `switchyard progress PERCENT [NOTE]`: run by an exec command, reports its job's
//! progress to the worker running it (over `SWITCHYARD_CONTROL_SOCKET`), which records
//! it in the job's status as a library handler's `ctx.progress` does.

use std::time::Duration;

use switchyard::{Error, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::cli::ProgressArgs;
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
                "{name} is not set: `switchyard progress` is run by a command of `switchyard work --exec`, which sets it"
            ))
        })
}

pub(crate) async fn run(args: ProgressArgs) -> Result<()> {
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
        progress: args.percent,
        note: args.note,
    };
    match tokio::time::timeout(ANSWER_WITHIN, talk(&socket, &request)).await {
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
        (false, why) => {
            Err(Error::Conflict(why.unwrap_or_else(|| {
                "the worker refused the progress report".into()
            })))
        }
    }
}
