//! What the network transports share about opening a connection: the check of TLS file
//! settings before any connection is tried, and the one-line cause of a first
//! connection that failed (refused, no route, DNS, no answer, TLS and why).
//!
//! The drivers' own errors say "pool timed out" or "invalid peer certificate:
//! UnknownIssuer"; an operator needs to hear which server, which address, and what to
//! change.

use std::fmt;
use std::io;
use std::time::Duration;

use crate::error::ConfigError;

/// The server a transport connects to, for messages: `PostgreSQL at db.example.com:5432`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The backend's name as users know it (`PostgreSQL`, `MySQL`, `RabbitMQ`).
    pub backend: &'static str,
    /// The host as written in the URL.
    pub host: String,
    /// The port, or the backend's default when the URL has none.
    pub port: u16,
}

impl Endpoint {
    /// The host and port of `url` (no credentials are kept), with `default_port` when
    /// the URL names none.
    pub fn from_url(backend: &'static str, url: &str, default_port: u16) -> Self {
        let parsed = url::Url::parse(url).ok();
        Endpoint {
            backend,
            host: parsed
                .as_ref()
                .and_then(|u| u.host_str().map(str::to_owned))
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "localhost".into()),
            port: parsed.and_then(|u| u.port()).unwrap_or(default_port),
        }
    }

    /// "no answer within {timeout}": the connection attempt neither succeeded nor
    /// failed in time (packets dropped by a firewall, a wrong address, a server too
    /// busy to accept).
    pub fn no_answer(&self, timeout: Duration) -> String {
        format!(
            "{self}: no answer within {} (QUEUE_CONNECT_TIMEOUT): the address drops packets (a firewall, a wrong host or port), or the server is too busy to accept",
            humantime::format_duration(timeout)
        )
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `host_str` keeps an IPv6 address in brackets already.
        if self.host.contains(':') && !self.host.starts_with('[') {
            write!(f, "{} at [{}]:{}", self.backend, self.host, self.port)
        } else {
            write!(f, "{} at {}:{}", self.backend, self.host, self.port)
        }
    }
}

/// The cause of a failed connection attempt at the socket level, in words.
pub fn io_cause(err: &io::Error) -> String {
    let text = err.to_string();
    // TLS libraries report a failed handshake through the stream, as an I/O error.
    if ["peer certificate", "alert", "TLS", "corrupt message"]
        .iter()
        .any(|t| text.contains(t))
    {
        return tls_cause(&text);
    }
    match err.kind() {
        io::ErrorKind::ConnectionRefused => {
            "connection refused (nothing listens on that port, or a firewall rejects it)".into()
        }
        io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => {
            format!("no route to host ({text})")
        }
        io::ErrorKind::TimedOut => format!("no answer ({text})"),
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::UnexpectedEof
        | io::ErrorKind::BrokenPipe => format!(
            "the server closed the connection during the handshake ({text}): a TLS-only port spoken to in plaintext, a plaintext port spoken to in TLS, or a server that refuses new connections"
        ),
        _ if text.contains("lookup address") || text.contains("Name or service not known") => {
            format!("DNS: the host name does not resolve ({text})")
        }
        _ => text,
    }
}

/// The cause of a failed TLS handshake, in words, from the TLS library's message.
pub fn tls_cause(detail: &str) -> String {
    let lower = detail.to_ascii_lowercase();
    let why = if lower.contains("unknownissuer") || lower.contains("unknown issuer") {
        "the server's certificate is not signed by a CA this client trusts (set the CA file: sslrootcert, ssl-ca or cacertfile)"
    } else if lower.contains("notvalidforname") || lower.contains("not valid for name") {
        "the server's certificate is not valid for the host name in the URL (connect by a name the certificate lists)"
    } else if lower.contains("expired") {
        "the server's certificate has expired"
    } else if lower.contains("notvalidyet") || lower.contains("not valid yet") {
        "the server's certificate is not valid yet (check the clocks)"
    } else if lower.contains("alert") && lower.contains("certificate") {
        "the server refused this client's certificate"
    } else if lower.contains("corrupt message") || lower.contains("invalidcontenttype") {
        "the server did not answer in TLS (a plaintext port?)"
    } else {
        "handshake failed"
    };
    format!("TLS: {why} ({detail})")
}

/// What a TLS file setting must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PemKind {
    /// One or more certificates (`-----BEGIN CERTIFICATE-----`): a CA bundle or a
    /// client certificate chain.
    Certificates,
    /// An unencrypted private key (PKCS#8, PKCS#1 or SEC1).
    PrivateKey,
}

/// Files larger than this are not PEM certificates or keys.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// Checks, before any connection, that the file a TLS setting names exists, can be
/// read, and holds what it must. The error names the setting and the path; it never
/// repeats the file's contents.
pub fn check_pem_file(setting: &str, path: &str, kind: PemKind) -> Result<(), ConfigError> {
    let what = match kind {
        PemKind::Certificates => "a readable PEM file of certificates (-----BEGIN CERTIFICATE-----)",
        PemKind::PrivateKey => {
            "a readable PEM file holding an unencrypted private key (-----BEGIN PRIVATE KEY-----, RSA PRIVATE KEY or EC PRIVATE KEY)"
        }
    };
    let bad = |why: String| ConfigError::new(setting, Some(path.into()), format!("{what}; {why}"));
    let meta = std::fs::metadata(path).map_err(|e| bad(format!("cannot open it: {e}")))?;
    if !meta.is_file() {
        return Err(bad("it is not a file".into()));
    }
    if meta.len() > MAX_PEM_BYTES {
        return Err(bad(format!(
            "it is {} bytes, too large for PEM",
            meta.len()
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    let text = String::from_utf8_lossy(&bytes);
    let ok = match kind {
        PemKind::Certificates => text.contains("-----BEGIN CERTIFICATE-----"),
        PemKind::PrivateKey => {
            if text.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----") {
                return Err(bad(
                    "it holds an encrypted key, which is not supported: decrypt it (openssl pkey -in KEY -out PLAIN)".into(),
                ));
            }
            [
                "PRIVATE KEY-----",
                "RSA PRIVATE KEY-----",
                "EC PRIVATE KEY-----",
            ]
            .iter()
            .any(|tag| text.contains(&format!("-----BEGIN {tag}")))
        }
    };
    if ok {
        Ok(())
    } else {
        Err(bad("it holds no such PEM block".into()))
    }
}

/// The query parameters of `url`, decoded, with their keys in lower case.
pub fn url_params(url: &str) -> Vec<(String, String)> {
    url::Url::parse(url)
        .map(|u| {
            u.query_pairs()
                .map(|(k, v)| (k.to_ascii_lowercase(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// The TLS parameters of one URL form, by the names it accepts for each.
#[derive(Debug, Clone, Copy)]
pub struct TlsParams<'a> {
    /// The setting the URL comes from, for messages (`DATABASE_URL`).
    pub setting: &'a str,
    /// Names of the mode parameter (`sslmode`, `ssl-mode`); empty when the scheme
    /// chooses TLS (`amqps`).
    pub mode: &'a [&'a str],
    /// The modes accepted, as documented (compared without case).
    pub modes: &'a [&'a str],
    /// The modes that cannot work without TLS in the build.
    pub tls_modes: &'a [&'a str],
    /// Names of the CA bundle parameter (`sslrootcert`, `ssl-ca`, `cacertfile`).
    pub ca: &'a [&'a str],
    /// Names of the client certificate parameter.
    pub cert: &'a [&'a str],
    /// Names of the client key parameter.
    pub key: &'a [&'a str],
}

impl TlsParams<'_> {
    /// Checks the URL's TLS settings before any connection: a known mode, TLS in this
    /// build (`tls_built`) when the mode needs it, and every file named existing and
    /// holding what it must, a client certificate with its key.
    pub fn check(&self, url: &str, tls_built: bool) -> Result<(), ConfigError> {
        let params = url_params(url);
        if let Some((key, mode)) = params.iter().find(|(k, _)| self.mode.contains(&k.as_str())) {
            let known = |list: &[&str]| list.iter().any(|m| m.eq_ignore_ascii_case(mode));
            if !known(self.modes) {
                return Err(ConfigError::new(
                    format!("{} {key}", self.setting),
                    Some(mode.clone()),
                    format!("one of {}", self.modes.join(", ")),
                ));
            }
            if !tls_built && known(self.tls_modes) {
                return Err(ConfigError::new(
                    format!("{} {key}", self.setting),
                    Some(mode.clone()),
                    "a mode without TLS: this build has none (enable the `tls` feature of the switchyard crate, on by default)",
                ));
            }
        }
        self.check_files(&params)
    }

    fn check_files(&self, params: &[(String, String)]) -> Result<(), ConfigError> {
        let find = |names: &[&str]| {
            params
                .iter()
                .find(|(k, _)| names.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
        };
        let setting = |key: &str| format!("{} {key}", self.setting);
        if let Some((k, path)) = find(self.ca) {
            check_pem_file(&setting(&k), &path, PemKind::Certificates)?;
        }
        match (find(self.cert), find(self.key)) {
            (Some((ck, cert)), Some((kk, key))) => {
                check_pem_file(&setting(&ck), &cert, PemKind::Certificates)?;
                check_pem_file(&setting(&kk), &key, PemKind::PrivateKey)?;
            }
            (Some((k, _)), None) | (None, Some((k, _))) => {
                return Err(ConfigError::new(
                    setting(&k),
                    None,
                    format!(
                        "a client certificate and its key together: {} with {}",
                        self.cert[0], self.key[0]
                    ),
                ))
            }
            (None, None) => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_names_host_and_port_but_no_credentials() {
        let e = Endpoint::from_url("PostgreSQL", "postgres://u:secret@db.example:6543/x", 5432);
        assert_eq!(e.to_string(), "PostgreSQL at db.example:6543");
        let e = Endpoint::from_url("MySQL", "mysql://u@[::1]/x", 3306);
        assert_eq!(e.to_string(), "MySQL at [::1]:3306");
    }

    #[test]
    fn a_refused_connection_is_named() {
        let err = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert!(io_cause(&err).starts_with("connection refused"));
    }

    #[test]
    fn tls_causes_say_what_to_change() {
        assert!(tls_cause("invalid peer certificate: UnknownIssuer").contains("not signed by a CA"));
        assert!(tls_cause("invalid peer certificate: NotValidForName").contains("host name"));
        assert!(tls_cause("invalid peer certificate: Expired").contains("expired"));
    }

    #[test]
    fn pem_files_are_checked_without_repeating_their_contents() {
        let dir = std::env::temp_dir().join(format!("sy-pem-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let key = dir.join("k.pem");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nSECRETBYTES\n-----END PRIVATE KEY-----\n",
        )
        .expect("write");
        let key = key.to_string_lossy().into_owned();
        assert!(check_pem_file("sslkey", &key, PemKind::PrivateKey).is_ok());
        let err = check_pem_file("sslrootcert", &key, PemKind::Certificates)
            .expect_err("a key is no certificate");
        let text = err.to_string();
        assert!(
            text.contains("sslrootcert") && !text.contains("SECRETBYTES"),
            "{text}"
        );
        let missing = check_pem_file("sslcert", "/nonexistent/c.pem", PemKind::Certificates)
            .expect_err("a missing file");
        assert!(missing.to_string().contains("cannot open it"), "{missing}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
