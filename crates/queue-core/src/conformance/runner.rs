//! Runs one case: on its own runtime, with a timeout, and the harness's teardown after
//! it whether it passed or failed; or skips it, outside CI, when its server is down.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::Result;

use super::harness::Harness;

/// Runs one case on its own runtime, panicking with the error when it fails.
pub fn run<F, Fut>(harness: Arc<dyn Harness>, case: F)
where
    F: FnOnce(Arc<dyn Harness>) -> Fut,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    if let Some(reason) = harness.skip_reason() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime for the conformance case");
    let outcome = rt.block_on(async {
        // A task of its own, so that the teardown runs after a failed assertion too.
        let case = tokio::spawn(tokio::time::timeout(
            Duration::from_secs(300),
            case(harness.clone()),
        ));
        let outcome = case.await;
        let _ = tokio::time::timeout(Duration::from_secs(60), harness.teardown()).await;
        outcome
    });
    match outcome {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(err))) => panic!("conformance case failed: {err}"),
        Ok(Err(_)) => panic!("conformance case did not finish within 300 s"),
        Err(join) => match join.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(err) => panic!("conformance case was cancelled: {err}"),
        },
    }
}

/// Whether the server of `url` (`scheme://user@host:port/…`) accepts TCP connections:
/// `None` when it does, otherwise a line saying that `backend`'s tests are skipped.
///
/// # Panics
/// Under `CI=true` an unreachable server is a failure, never a skip.
pub fn skip_unless_reachable(backend: &str, url: &str, default_port: u16) -> Option<String> {
    use std::net::{TcpStream, ToSocketAddrs};

    let authority = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split(['/', '?'])
        .next()
        .unwrap_or_default();
    let host_port = authority.rsplit('@').next().unwrap_or(authority);
    let host_port = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:{default_port}")
    };
    let reachable = host_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .is_some_and(|addr| TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok());
    if reachable {
        return None;
    }
    let why = format!(
        "{backend} tests skipped: no server at {host_port} (run scripts/test, which installs and starts one)"
    );
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{why}; under CI=true an unreachable backend is a failure"
    );
    Some(why)
}
