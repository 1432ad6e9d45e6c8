//! Listen addresses of the servers the commands start (`serve`, `work --metrics-listen`).

use std::net::SocketAddr;

use switchyard::{ConfigError, Error, Result};

/// Parses a listen address (`HOST:PORT`; port 0 picks a free one).
pub(crate) fn parse_listen(flag: &str, addr: &str) -> Result<SocketAddr> {
    addr.parse().map_err(|_| {
        ConfigError::new(
            flag,
            Some(addr.to_owned()),
            "an address such as 127.0.0.1:8080 or 0.0.0.0:8080 (IP:PORT)",
        )
        .into()
    })
}

/// Binds `addr`, or says why not and how to choose another.
pub(crate) async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        Error::io(
            format!("cannot listen on {addr} (choose another with --listen IP:PORT)"),
            e,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_are_checked() {
        assert!(parse_listen("--listen", "127.0.0.1:0").is_ok());
        let err = parse_listen("--listen", "localhost").expect_err("not an IP:PORT");
        assert!(err.to_string().contains("IP:PORT"), "{err}");
    }
}
