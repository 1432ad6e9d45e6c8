//! The DNS-rebinding guard of the servers the commands start on a loopback address.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// Whether the server listens on a loopback address (the guard's state).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Loopback(pub(crate) bool);

/// On a loopback address, refuses requests that name another host: a page whose DNS
/// name was rebound to 127.0.0.1 would otherwise count as same-origin to the browser
/// and could read and change everything the server offers.
pub(crate) async fn guard_host(
    State(Loopback(loopback)): State<Loopback>,
    request: Request,
    next: Next,
) -> Response {
    if loopback {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok());
        if let Some(host) = host {
            if !is_loopback_host(host) {
                let error =
                    format!("this server answers to 127.0.0.1, [::1] or localhost, not {host}");
                return (
                    StatusCode::MISDIRECTED_REQUEST,
                    Json(serde_json::json!({ "error": error })),
                )
                    .into_response();
            }
        }
    }
    next.run(request).await
}

/// `127.0.0.1:8080`, `localhost`, `[::1]:8080`… (with or without a port).
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_told_apart() {
        for ok in [
            "127.0.0.1:8080",
            "localhost",
            "LOCALHOST:1",
            "[::1]:80",
            "127.0.0.2",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "10.0.0.1:8080",
            "[::2]:80",
            "localhost.evil.example",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }
}
