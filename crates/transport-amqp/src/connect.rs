//! Where the transport connects: the broker addresses of `AMQP_URL` (one broker, or
//! the nodes of a cluster, comma-separated), their TLS settings, and one connection
//! attempt, bounded by the connect timeout and reported as one line naming the node and
//! the cause.
//!
//! TLS settings are query parameters named as in RabbitMQ's URI spec: `cacertfile`,
//! `certfile`, `keyfile`. They are checked before any connection and taken off the URI
//! before lapin sees it; the files are read at each connection, so that a renewed
//! certificate is used at the next reconnect.

use std::time::Duration;

use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::{Connection, ConnectionProperties};
use queue_core::connect::{io_cause, Endpoint, TlsParams};
use queue_core::{split_url_list, ConfigError, Error, Result, SecretUrl};

use crate::error::TRANSPORT;

/// The TLS parameters of an `amqps://` URL.
const TLS: TlsParams<'static> = TlsParams {
    setting: "AMQP_URL",
    mode: &[],
    modes: &[],
    tls_modes: &[],
    ca: &["cacertfile"],
    cert: &["certfile"],
    key: &["keyfile"],
};

/// Parameters this transport reads itself; every other one goes to lapin
/// (`heartbeat`, `connection_timeout`, `frame_max`, `channel_max`, `auth_mechanism`).
const OURS: [&str; 3] = ["cacertfile", "certfile", "keyfile"];

/// Parameters of RabbitMQ's URI spec this transport does not take, with why.
const REFUSED: [(&str, &str); 3] = [
    (
        "verify",
        "certificates are always verified (give the CA as cacertfile=)",
    ),
    (
        "server_name_indication",
        "the name sent and verified is the URL's host: connect by the name the certificate lists",
    ),
    (
        "password",
        "a key file protected by a password is not supported: decrypt it (openssl pkey)",
    ),
];

/// One broker address: the URI lapin connects to, where it is, and its TLS files.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    uri: SecretUrl,
    /// Host and port, for messages and [`crate::AmqpTransport::connected_node`].
    pub(crate) endpoint: Endpoint,
    tls: bool,
    ca: Option<String>,
    identity: Option<(String, String)>,
}

/// The nodes of `url`: one broker, or several comma-separated URLs that share their
/// scheme, credentials and vhost. Every setting is checked here, before any connection.
pub(crate) fn nodes(url: &SecretUrl) -> Result<Vec<Node>> {
    let bad = |why: &str| {
        Error::from(ConfigError::new(
            "AMQP_URL",
            Some(url.to_string()),
            format!("amqp://USER:PASSWORD@HOST:PORT/VHOST or amqps://…, or several separated by commas; {why}"),
        ))
    };
    let mut nodes = Vec::new();
    let mut shared: Option<(String, String, Option<String>, String)> = None;
    for one in split_url_list(url.expose()) {
        let parsed = url::Url::parse(one).map_err(|e| bad(&format!("{e}")))?;
        let tls = match parsed.scheme() {
            "amqp" => false,
            "amqps" => true,
            other => return Err(bad(&format!("the scheme {other}:// is not AMQP"))),
        };
        let host = parsed.host_str().filter(|h| !h.is_empty());
        let Some(host) = host else {
            return Err(bad("a URL names no host"));
        };
        let identity = (
            parsed.scheme().to_owned(),
            parsed.username().to_owned(),
            parsed.password().map(str::to_owned),
            parsed.path().to_owned(),
        );
        match &shared {
            None => shared = Some(identity),
            Some(first) if *first == identity => {}
            Some(_) => {
                return Err(bad(
                    "the nodes of a cluster share their scheme, user, password and vhost",
                ))
            }
        }
        let params: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.into_owned()))
            .collect();
        for (key, why) in REFUSED {
            if params.iter().any(|(k, _)| k == key) {
                return Err(ConfigError::new(format!("AMQP_URL {key}"), None, why).into());
            }
        }
        let find = |key: &str| {
            params
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        if !tls {
            if let Some(key) = OURS.iter().find(|k| find(k).is_some()) {
                return Err(ConfigError::new(
                    format!("AMQP_URL {key}"),
                    None,
                    "TLS settings with amqps:// only (this URL is plain amqp://)",
                )
                .into());
            }
        } else if !cfg!(feature = "tls") {
            return Err(bad(
                "this build has no TLS: enable the `tls` feature of the switchyard crate (on by default)",
            ));
        }
        TLS.check(one, true)?;
        let mut lapin_uri = parsed.clone();
        let passed: Vec<(String, String)> = parsed
            .query_pairs()
            .filter(|(k, _)| !OURS.contains(&k.to_ascii_lowercase().as_str()))
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        if passed.is_empty() {
            lapin_uri.set_query(None);
        } else {
            lapin_uri.query_pairs_mut().clear().extend_pairs(passed);
        }
        let default_port = if tls { 5671 } else { 5672 };
        nodes.push(Node {
            uri: SecretUrl::new(lapin_uri.as_str()),
            endpoint: Endpoint {
                backend: "RabbitMQ",
                host: host.to_owned(),
                port: parsed.port().unwrap_or(default_port),
            },
            tls,
            ca: find("cacertfile"),
            identity: find("certfile").zip(find("keyfile")),
        });
    }
    Ok(nodes)
}

impl Node {
    /// The TLS files read now (checked at start, but they may have changed since).
    fn tls_config(&self) -> Result<OwnedTLSConfig> {
        let read = |key: &str, path: &str| {
            std::fs::read(path).map_err(|e| {
                Error::from(ConfigError::new(
                    format!("AMQP_URL {key}"),
                    Some(path.to_owned()),
                    format!("a readable PEM file; cannot read it: {e}"),
                ))
            })
        };
        let cert_chain = match &self.ca {
            Some(path) => Some(String::from_utf8_lossy(&read("cacertfile", path)?).into_owned()),
            None => None,
        };
        let identity = match &self.identity {
            Some((cert, key)) => Some(OwnedIdentity::PKCS8 {
                pem: read("certfile", cert)?,
                key: read("keyfile", key)?,
            }),
            None => None,
        };
        Ok(OwnedTLSConfig {
            identity,
            cert_chain,
        })
    }

    /// Opens a connection to this node within `timeout`, or fails in one line naming
    /// the node and the cause.
    pub(crate) async fn connect(
        &self,
        props: ConnectionProperties,
        timeout: Duration,
    ) -> Result<Connection> {
        let tls = if self.tls {
            self.tls_config()?
        } else {
            OwnedTLSConfig::default()
        };
        let runtime =
            lapin::runtime::default_runtime().map_err(|e| Error::backend(TRANSPORT, false, e))?;
        let uri = self.lapin_uri()?;
        let attempt = Connection::connect_uri_with_config(uri, props, tls, runtime);
        match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(err)) => Err(self.describe(&err)),
            Err(_) => Err(Error::backend(
                TRANSPORT,
                true,
                self.endpoint.no_answer(timeout),
            )),
        }
    }

    /// The node's URL as lapin takes it. Parsed here, not by lapin from text: its parse
    /// takes the host from `Url::domain`, which has none for an IPv6 literal, and falls
    /// back to localhost. Its error would quote the URL, password and all, so it is not
    /// passed on.
    fn lapin_uri(&self) -> Result<lapin::uri::AMQPUri> {
        let mut uri: lapin::uri::AMQPUri = self.uri.expose().parse().map_err(|_| {
            Error::backend(
                TRANSPORT,
                false,
                format!("the URL of {} did not parse as AMQP", self.endpoint),
            )
        })?;
        if let Some(ip) = self
            .endpoint
            .host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
        {
            uri.authority.host = ip.to_owned();
        }
        Ok(uri)
    }

    /// A failed connection attempt as one line: the node, then what went wrong.
    fn describe(&self, err: &lapin::Error) -> Error {
        let (transient, cause) = match err.kind() {
            lapin::ErrorKind::IOError(io) => {
                let cause = io_cause(io);
                // A certificate that does not verify will not verify on a retry.
                (!cause.starts_with("TLS:"), cause)
            }
            lapin::ErrorKind::ProtocolError(amqp) => {
                let text = amqp.get_message().as_str().to_owned();
                match amqp.get_id() {
                    403 => (false, format!("authentication refused: {text}")),
                    530 => (
                        false,
                        format!("the vhost does not exist or this user may not use it: {text}"),
                    ),
                    _ => (false, text),
                }
            }
            lapin::ErrorKind::ParsingError(_) | lapin::ErrorKind::InvalidProtocolVersion(_) => (
                false,
                format!("the server does not speak AMQP 0-9-1 here ({err}): a TLS-only port spoken to in plaintext (use amqps://), or not RabbitMQ"),
            ),
            _ => (true, err.to_string()),
        };
        Error::backend(TRANSPORT, transient, format!("{}: {cause}", self.endpoint))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(url: &str) -> Node {
        let mut nodes = nodes(&SecretUrl::new(url)).expect("a valid URL");
        assert_eq!(nodes.len(), 1);
        nodes.remove(0)
    }

    #[test]
    fn an_ipv6_literal_host_is_the_host_lapin_connects_to() {
        let uri = node("amqp://u:p@[2001:db8::1]:5673/v")
            .lapin_uri()
            .expect("a lapin URI");
        assert_eq!(
            (uri.authority.host.as_str(), uri.authority.port),
            ("2001:db8::1", 5673)
        );
        assert_eq!(uri.vhost, "v");
    }

    #[test]
    fn named_and_ipv4_hosts_pass_through() {
        for (url, host) in [
            ("amqp://u:p@rabbit.internal/%2f", "rabbit.internal"),
            ("amqp://u:p@127.0.0.1:5672/%2f", "127.0.0.1"),
        ] {
            let uri = node(url).lapin_uri().expect("a lapin URI");
            assert_eq!(uri.authority.host, host);
            assert_eq!(uri.authority.userinfo.password, "p");
        }
    }
}
