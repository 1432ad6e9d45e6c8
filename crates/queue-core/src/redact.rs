use std::fmt;

/// Query parameters whose values are secrets.
const SECRET_PARAMS: [&str; 8] = [
    "password",
    "pass",
    "passwd",
    "pwd",
    "secret",
    "token",
    "sslpassword",
    "api_key",
];

/// Replaces the password of a URL, and the values of password-like query parameters,
/// with `***`, so that it can be logged. Works on text that is not a valid URL too,
/// including passwords with unescaped `/`, `?` or `#`.
pub fn redact_url(url: &str) -> String {
    // A list of URLs (the nodes of a RabbitMQ cluster): each redacted on its own.
    let parts = split_url_list(url);
    if parts.len() > 1 {
        return parts
            .iter()
            .map(|p| redact_one(p))
            .collect::<Vec<_>>()
            .join(",");
    }
    redact_one(url)
}

/// `text` cut at each comma that starts another URL (`,scheme://`); a comma inside a
/// password or a query stays where it is.
pub fn split_url_list(text: &str) -> Vec<&str> {
    let starts_url = |rest: &str| {
        let scheme_len = rest.find("://").filter(|&n| n > 0).filter(|&n| {
            rest[..n]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        });
        scheme_len.is_some()
    };
    let mut parts = Vec::new();
    let mut start = 0;
    for (i, c) in text.char_indices() {
        if c == ',' && i > start && starts_url(text[i + 1..].trim_start()) {
            parts.push(text[start..i].trim());
            start = i + 1;
        }
    }
    parts.push(text[start..].trim());
    parts
}

fn redact_one(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return redact_query(url);
    };
    let (head, rest) = url.split_at(scheme_end + 3);
    // The user info ends at the last `@` before the query, and the query starts at the
    // first `?` after the first `@` (a password may hold `@`, `=`, `/` or `?`).
    let at = rest.find('@').map(|first| {
        let query = rest[first..].find('?').map_or(rest.len(), |q| first + q);
        rest[..query].rfind('@').unwrap_or(first)
    });
    let (user_part, host_part) = match at {
        Some(at) => {
            let user_info = &rest[..at];
            let user = match user_info.find(':') {
                Some(colon) => format!("{}:***", &user_info[..colon]),
                // No password here: perhaps not user info at all, but a query holding `@`.
                None => redact_query(user_info),
            };
            (format!("{user}@"), &rest[at + 1..])
        }
        None => (String::new(), rest),
    };
    format!("{head}{user_part}{}", redact_query(host_part))
}

/// The first password-like query parameter of `url` that is not in `supported`: a
/// driver that does not know a parameter may log it, value and all, so a transport
/// refuses it instead.
pub fn unsupported_secret_param(url: &str, supported: &[&str]) -> Option<String> {
    let (_, query) = url.rsplit_once('?')?;
    query.split('&').find_map(|pair| {
        let key = pair.split_once('=').map_or(pair, |(k, _)| k);
        let lower = key.to_ascii_lowercase();
        (SECRET_PARAMS.contains(&lower.as_str()) && !supported.contains(&lower.as_str()))
            .then(|| key.to_owned())
    })
}

fn redact_query(text: &str) -> String {
    let Some(q) = text.find('?') else {
        return text.to_owned();
    };
    let (base, query) = text.split_at(q + 1);
    let params: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if SECRET_PARAMS.contains(&k.to_ascii_lowercase().as_str()) => {
                format!("{k}=***")
            }
            _ => pair.to_owned(),
        })
        .collect();
    format!("{base}{}", params.join("&"))
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
    fn every_url_of_a_list_is_redacted() {
        let list = "amqps://u:p1@h1:5671/v,amqps://u:p,2@h2:5671/v, amqp://u:p3@h3/v";
        assert_eq!(split_url_list(list).len(), 3);
        let shown = redact_url(list);
        assert_eq!(
            shown,
            "amqps://u:***@h1:5671/v,amqps://u:***@h2:5671/v,amqp://u:***@h3/v"
        );
    }

    #[test]
    fn passwords_with_equals_signs_and_queries_with_at_signs_never_show() {
        for (url, secret) in [
            ("postgres://app:abc=def@db/prod", "abc=def"),
            (
                "postgres://app:b64+/x==@db/prod?sslmode=require",
                "b64+/x==",
            ),
            ("mysql://app:p=w@db/prod?password=q@r", "p=w"),
            ("postgres://db/prod?password=s3cret@x", "s3cret"),
        ] {
            let shown = redact_url(url);
            assert!(!shown.contains(secret), "{url} -> {shown}");
        }
        assert_eq!(
            redact_url("postgres://app:abc=def@db/prod"),
            "postgres://app:***@db/prod"
        );
    }

    #[test]
    fn secret_parameters_a_driver_does_not_know_are_found() {
        let url = "postgres://app@db/prod?sslmode=require&sslpassword=x";
        assert_eq!(
            unsupported_secret_param(url, &["password"]).as_deref(),
            Some("sslpassword")
        );
        assert_eq!(
            unsupported_secret_param("postgres://db/p?password=x", &["password"]),
            None
        );
        assert_eq!(
            unsupported_secret_param("postgres://db/p", &["password"]),
            None
        );
    }

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
