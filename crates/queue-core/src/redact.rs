use std::fmt;

/// Replaces the password (and any user info after the first `:`) of a URL with `***`, so
/// that it can be logged. Works on text that is not a valid URL too.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let user_info = &authority[..at];
    let user = match user_info.find(':') {
        Some(colon) => format!("{}:***", &user_info[..colon]),
        None => user_info.to_owned(),
    };
    format!("{}://{}@{}", &url[..scheme_end], user, &rest[at + 1..])
}

/// A connection URL whose `Debug` and `Display` never show the password.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> Self {
        SecretUrl(url.into())
    }

    /// The full URL, password included: only for handing to a driver.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL's scheme (`postgres`, `sqlite`, …), lowercased.
    pub fn scheme(&self) -> String {
        self.0
            .split_once(':')
            .map(|(s, _)| s.to_ascii_lowercase())
            .unwrap_or_default()
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretUrl({:?})", redact_url(&self.0))
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/prod?sslmode=require"),
            "postgres://app:***@db:5432/prod?sslmode=require"
        );
        assert_eq!(
            redact_url("amqp://guest:guest@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            redact_url("mysql://root@localhost/test"),
            "mysql://root@localhost/test"
        );
        assert_eq!(
            redact_url("sqlite://switchyard.db"),
            "sqlite://switchyard.db"
        );
        assert_eq!(
            redact_url("postgres://u:p@ss@h/db"),
            "postgres://u:***@h/db"
        );
        let url = SecretUrl::new("postgres://app:s3cret@db/prod");
        assert!(!format!("{url:?} {url}").contains("s3cret"));
        assert_eq!(url.expose(), "postgres://app:s3cret@db/prod");
    }
}
