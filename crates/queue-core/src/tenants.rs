//! Tenants: stores of their own, named by `QUEUE_SCHEMA` (`--schema`).
//!
//! A tenant is a name, and each backend keeps it apart in its own way: a PostgreSQL
//! schema, a MySQL/MariaDB database, a SQLite file, a RabbitMQ vhost. Where a URL says
//! `{tenant}` (`sqlite://data/{tenant}.db`, `amqp://u:p@host/{tenant}`), the tenant's
//! name goes there; otherwise into the schema (PostgreSQL) or database (MySQL).
//! Nothing is shared between two tenants' stores, so no job, status, dead letter or
//! stat of one can be read through the other.
//!
//! `QUEUE_SCHEMA` names one tenant, or several (`a,b,c`), or a pattern (`acme_*`,
//! with `*`, `?` and `[…]` as in a shell). Only the commands that serve many tenants
//! at once (`switchyard work`, `stats`, `dead list`) take several; the rest need one.

use crate::error::ConfigError;
use crate::names::Identifier;

/// Where a URL takes the tenant's name.
pub const PLACEHOLDER: &str = "{tenant}";
/// [`PLACEHOLDER`] as a URL parser writes it back, in lower case.
const PLACEHOLDER_ENCODED: &str = "%7btenant%7d";

/// Several tenants, or patterns that find them: a `QUEUE_SCHEMA` with a comma or a
/// wildcard.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TenantSelection {
    /// The tenants named outright.
    pub names: Vec<Identifier>,
    /// Shell-style patterns (`acme_*`); the tenants they match are found in the store.
    pub patterns: Vec<glob::Pattern>,
}

impl TenantSelection {
    /// Parses `QUEUE_SCHEMA`'s value when it names more than one tenant or a pattern;
    /// `Ok(None)` for one plain name.
    pub fn parse(setting: &str, value: &str) -> Result<Option<Self>, ConfigError> {
        let items: Vec<&str> = value.split(',').map(str::trim).collect();
        let wild = |s: &str| s.contains(['*', '?', '[']);
        if items.len() == 1 && !wild(items[0]) {
            return Ok(None);
        }
        let mut selection = TenantSelection {
            names: Vec::new(),
            patterns: Vec::new(),
        };
        for item in items {
            if item.is_empty() {
                return Err(ConfigError::new(
                    setting,
                    Some(value.to_owned()),
                    "tenant names or patterns separated by commas, with none empty (a,b,c or acme_*)",
                ));
            }
            if wild(item) {
                let pattern = glob::Pattern::new(item).map_err(|e| {
                    ConfigError::new(
                        setting,
                        Some(item.to_owned()),
                        format!("a shell-style pattern with *, ? or […] ({e})"),
                    )
                })?;
                selection.patterns.push(pattern);
            } else {
                let name = Identifier::new(setting, item)?;
                if !selection.names.contains(&name) {
                    selection.names.push(name);
                }
            }
        }
        Ok(Some(selection))
    }

    /// Whether a found tenant's name is selected.
    pub fn matches(&self, name: &str) -> bool {
        self.names.iter().any(|n| n.as_str() == name)
            || self.patterns.iter().any(|p| p.matches(name))
    }
}

impl std::fmt::Display for TenantSelection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let all: Vec<&str> = self
            .names
            .iter()
            .map(Identifier::as_str)
            .chain(self.patterns.iter().map(glob::Pattern::as_str))
            .collect();
        f.write_str(&all.join(","))
    }
}

/// Whether `url` takes the tenant's name (it says `{tenant}`).
pub fn is_template(url: &str) -> bool {
    url.contains(PLACEHOLDER) || url.to_ascii_lowercase().contains(PLACEHOLDER_ENCODED)
}

/// Whether every `{tenant}` of `url` is in its path (the SQLite file, the database, the
/// vhost), where it gives each tenant a store of its own; one in the user name or a
/// query parameter would leave the tenants sharing one.
pub fn in_path(url: &str) -> bool {
    let lower = url
        .to_ascii_lowercase()
        .replace(PLACEHOLDER_ENCODED, PLACEHOLDER);
    let start = match lower.strip_prefix("sqlite:") {
        Some(_) => "sqlite:".len(),
        None => lower
            .find("://")
            .and_then(|i| lower[i + 3..].find('/').map(|j| i + 3 + j))
            .unwrap_or(lower.len()),
    };
    let end = lower[start..]
        .find(['?', '#'])
        .map_or(lower.len(), |i| start + i);
    let inside = lower[start..end].matches(PLACEHOLDER).count();
    inside > 0 && inside == lower.matches(PLACEHOLDER).count()
}

/// `url` with the tenant's name in place of `{tenant}`.
pub fn fill(url: &str, tenant: &str) -> String {
    url.replace(PLACEHOLDER, tenant)
        .replace(PLACEHOLDER_ENCODED, tenant)
        .replace("%7Btenant%7D", tenant)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_plain_name_is_not_a_selection() {
        assert_eq!(
            TenantSelection::parse("QUEUE_SCHEMA", "acme").ok(),
            Some(None)
        );
    }

    #[test]
    fn lists_and_patterns_are_selections() {
        let s = TenantSelection::parse("QUEUE_SCHEMA", "a, b,acme_*,a")
            .expect("valid")
            .expect("a selection");
        assert_eq!(s.names.len(), 2, "duplicates collapse");
        assert!(s.matches("a") && s.matches("b") && s.matches("acme_1"));
        assert!(!s.matches("acme") && !s.matches("c"));
        assert_eq!(s.to_string(), "a,b,acme_*");
    }

    #[test]
    fn bad_items_are_named() {
        for (value, says) in [
            ("a,,b", "none empty"),
            ("a,b-c", "bare SQL identifier"),
            ("a,[x", "pattern"),
        ] {
            let err = TenantSelection::parse("QUEUE_SCHEMA", value)
                .expect_err("refused")
                .to_string();
            assert!(err.contains("QUEUE_SCHEMA") && err.contains(says), "{err}");
        }
    }

    #[test]
    fn urls_take_the_name_where_they_say_tenant() {
        assert!(is_template("sqlite://data/{tenant}.db"));
        assert!(is_template("amqp://u:p@h/%7Btenant%7D"));
        assert!(!is_template("amqp://u:p@h/%2f"));
        assert_eq!(fill("sqlite://data/{tenant}.db", "a"), "sqlite://data/a.db");
        assert_eq!(fill("amqp://h/%7Btenant%7D", "b"), "amqp://h/b");
    }

    #[test]
    fn only_a_tenant_in_the_path_gives_a_store_of_its_own() {
        for url in [
            "sqlite://data/{tenant}.db",
            "sqlite:{tenant}.db?mode=rwc",
            "amqp://u:p@mq:5672/{tenant}",
            "amqp://u:p@mq/%7btenant%7d",
            "postgres://app@db/{tenant}",
        ] {
            assert!(in_path(url), "{url}");
        }
        for url in [
            "amqp://{tenant}:pw@mq/%2f",
            "sqlite://jobs.db?cache={tenant}",
            "postgres://app@db/app?application_name={tenant}",
            "sqlite://data/{tenant}.db?x={tenant}",
        ] {
            assert!(!in_path(url), "{url}");
        }
    }
}
