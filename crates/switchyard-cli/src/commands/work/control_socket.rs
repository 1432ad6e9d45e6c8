//! The channel from an exec command back to its worker: a Unix socket per `work`
//! process (its path in `SWITCHYARD_CONTROL_SOCKET`), on which `switchyard progress`
//! sends one JSON line naming the job and its lease token, and reads one back.
//!
//! The worker answers for a job it is running under that very token only, so a command
//! left running by a worker that lost its lease (or a stray script) changes nothing of
//! the run that took over.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use switchyard::worker::JobContext;
use switchyard::{CancellationToken, Error, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use uuid::Uuid;

use crate::control_protocol::{Reply, Request};

/// The jobs this process runs, by id: their lease token and context.
#[derive(Debug, Default)]
pub(crate) struct Running(Mutex<HashMap<Uuid, (String, JobContext)>>);

/// The socket and the running jobs it answers for.
#[derive(Debug)]
pub(crate) struct ControlSocket {
    /// The socket's path, handed to commands.
    pub(crate) path: PathBuf,
    pub(crate) running: Arc<Running>,
    /// The directory holding it, removed when the worker ends.
    _dir: tempfile::TempDir,
}

/// A job registered while its command runs; unregistered when dropped.
pub(crate) struct Registered {
    running: Arc<Running>,
    id: Uuid,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Ok(mut jobs) = self.running.0.lock() {
            jobs.remove(&self.id);
        }
    }
}

impl ControlSocket {
    /// Listens on a socket in a fresh private directory until `stop`.
    pub(crate) fn start(stop: CancellationToken) -> Result<Arc<Self>> {
        let dir = tempfile::Builder::new()
            .prefix("switchyard-")
            .tempdir()
            .map_err(|source| Error::Io {
                what: "making a directory for the command control socket".into(),
                source,
            })?;
        let path = dir.path().join("control.sock");
        let listener = UnixListener::bind(&path).map_err(|source| Error::Io {
            what: format!("listening on {}", path.display()),
            source,
        })?;
        let socket = Arc::new(ControlSocket {
            path,
            running: Arc::default(),
            _dir: dir,
        });
        let running = socket.running.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = stop.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                match accepted {
                    Ok((stream, _)) => {
                        tokio::spawn(answer(stream, running.clone()));
                    }
                    Err(e) => tracing::debug!(error = %e, "control socket accept failed"),
                }
            }
        });
        Ok(socket)
    }

    /// Registers a running job for the lifetime of the returned guard.
    pub(crate) fn register(&self, ctx: &JobContext) -> Registered {
        let id = ctx.envelope.id;
        if let Ok(mut jobs) = self.running.0.lock() {
            jobs.insert(id, (ctx.lease_token.to_string(), ctx.clone()));
        }
        Registered {
            running: self.running.clone(),
            id,
        }
    }
}

async fn answer(stream: UnixStream, running: Arc<Running>) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let reply = match BufReader::new(read)
        .take(crate::control_protocol::MAX_LINE)
        .read_line(&mut line)
        .await
    {
        Ok(_) => handle(&line, &running),
        Err(e) => Reply {
            ok: false,
            error: Some(format!("reading the request failed: {e}")),
        },
    };
    let mut text = serde_json::to_string(&reply).unwrap_or_else(|_| "{}".into());
    text.push('\n');
    let _ = write.write_all(text.as_bytes()).await;
}

fn handle(line: &str, running: &Running) -> Reply {
    let refuse = |why: String| Reply {
        ok: false,
        error: Some(why),
    };
    let req: Request = match serde_json::from_str(line) {
        Ok(req) => req,
        Err(e) => return refuse(format!("not a request: {e}")),
    };
    if req.progress > 100 {
        return refuse(format!("progress {}: accepted are 0 to 100", req.progress));
    }
    let ctx = match running.0.lock() {
        Ok(jobs) => match jobs.get(&req.id) {
            Some((token, ctx)) if *token == req.token => ctx.clone(),
            Some(_) => {
                return refuse(format!(
                    "job {} is running under another lease: this command's run was overtaken",
                    req.id
                ))
            }
            None => return refuse(format!("this worker is not running job {}", req.id)),
        },
        Err(_) => return refuse("the worker's job table is unusable".into()),
    };
    ctx.progress(req.progress, req.note.unwrap_or_default());
    Reply {
        ok: true,
        error: None,
    }
}
