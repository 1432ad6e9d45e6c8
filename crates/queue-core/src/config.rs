use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::ConfigError;
use crate::names::Identifier;
use crate::redact::{redact_url, SecretUrl};
use crate::tenants::{self, TenantSelection};

/// The lease a reservation holds unless configured otherwise.
pub const DEFAULT_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(90);

/// Which backend carries the messages (`QUEUE_BACKEND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// The SQL database named by `DATABASE_URL`.
    Exec,
    /// RabbitMQ at `AMQP_URL`.
    RabbitMq,
}

impl FromStr for BackendKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "exec" => Ok(BackendKind::Exec),
            "rabbitmq" => Ok(BackendKind::RabbitMq),
            _ => Err(ConfigError::new(
                "QUEUE_BACKEND",
                Some(s.into()),
                "expected exec or rabbitmq",
            )),
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Exec => "exec",
            BackendKind::RabbitMq => "rabbitmq",
        })
    }
}

/// Whether workers also drain the backend they are leaving (`QUEUE_DRAIN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DrainSetting {
    /// Unset: drain the other backend when its URL is configured (`DATABASE_URL` under
    /// `QUEUE_BACKEND=rabbitmq`, `AMQP_URL` under `QUEUE_BACKEND=exec`).
    #[default]
    Detect,
    /// `none`: never.
    Off,
    /// `exec` or `rabbitmq`: that backend.
    From(BackendKind),
}

impl FromStr for DrainSetting {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "exec" => Ok(DrainSetting::From(BackendKind::Exec)),
            "rabbitmq" => Ok(DrainSetting::From(BackendKind::RabbitMq)),
            "none" => Ok(DrainSetting::Off),
            _ => Err(ConfigError::new(
                "QUEUE_DRAIN",
                Some(s.into()),
                "expected exec, rabbitmq or none",
            )),
        }
    }
}

impl BackendKind {
    /// The other backend.
    pub fn other(self) -> BackendKind {
        match self {
            BackendKind::Exec => BackendKind::RabbitMq,
            BackendKind::RabbitMq => BackendKind::Exec,
        }
    }
}

/// How SQL transports claim rows (`QUEUE_CLAIM`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ClaimStrategy {
    /// Row locks skipped by competitors (`FOR UPDATE SKIP LOCKED`; on SQLite one atomic
    /// `UPDATE … RETURNING`).
    #[default]
    SkipLocked,
    /// Portable compare-and-set on a candidate row.
    Optimistic,
}

impl FromStr for ClaimStrategy {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "skip-locked" => Ok(ClaimStrategy::SkipLocked),
            "optimistic" => Ok(ClaimStrategy::Optimistic),
            _ => Err(ConfigError::new(
                "QUEUE_CLAIM",
                Some(s.into()),
                "expected skip-locked or optimistic",
            )),
        }
    }
}

impl fmt::Display for ClaimStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClaimStrategy::SkipLocked => "skip-locked",
            ClaimStrategy::Optimistic => "optimistic",
        })
    }
}

/// `value` of `setting` as a duration within `range`, else an error saying `expected`.
fn duration_in(
    setting: &str,
    value: String,
    range: std::ops::RangeInclusive<Duration>,
    expected: &str,
) -> Result<Duration, ConfigError> {
    let d = parse_duration(setting, &value)?;
    if range.contains(&d) {
        Ok(d)
    } else {
        Err(ConfigError::new(setting, Some(value), expected))
    }
}

/// `value` of `setting` as one of two words: true for the first, false for the second.
fn either(setting: &str, value: String, [yes, no]: [&str; 2]) -> Result<bool, ConfigError> {
    match value.trim() {
        v if v == yes => Ok(true),
        v if v == no => Ok(false),
        _ => Err(ConfigError::new(
            setting,
            Some(value),
            format!("expected {yes} or {no}"),
        )),
    }
}

/// Parses a duration written `250ms`, `10s`, `5m`, `1h` or `30d`; `setting` names the
/// variable or flag in the error.
pub fn parse_duration(setting: &str, value: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(value.trim()).map_err(|_| {
        ConfigError::new(
            setting,
            Some(value.into()),
            "expected a duration such as 250ms, 10s, 5m, 1h or 30d",
        )
    })
}

/// Configuration of the contract, read from the environment (`Config::from_env`) or any
/// lookup (the CLI layers its flags over the environment this way).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// `QUEUE_BACKEND`.
    pub backend: BackendKind,
    /// `DATABASE_URL`.
    pub database_url: SecretUrl,
    /// `AMQP_URL`.
    pub amqp_url: SecretUrl,
    /// `QUEUE_CLAIM`.
    pub claim: ClaimStrategy,
    /// `QUEUE_CANARY_PERCENT`: share of publishes sent to the other backend.
    pub canary_percent: u8,
    /// `QUEUE_VISIBILITY_TIMEOUT`: the lease of a reservation.
    pub visibility_timeout: Duration,
    /// `QUEUE_TABLE`.
    pub table: Identifier,
    /// The schema (PostgreSQL) or database (MySQL) of the store: `QUEUE_SCHEMA`'s one
    /// tenant, unless `DATABASE_URL` takes the tenant's name itself (`{tenant}`).
    pub schema: Option<Identifier>,
    /// The tenant this configuration opens: `QUEUE_SCHEMA` when it names one (see
    /// [`crate::tenants`]).
    pub tenant: Option<Identifier>,
    /// Several tenants, or patterns (`QUEUE_SCHEMA=a,b` or `acme_*`); `None` for one or
    /// none. [`Config::for_tenant`] gives each tenant's configuration.
    pub tenants: Option<TenantSelection>,
    /// `QUEUE_DRAIN`.
    pub drain: DrainSetting,
    /// Whether `DATABASE_URL` was set (rather than defaulted).
    pub database_url_set: bool,
    /// Whether `AMQP_URL` was set (rather than defaulted).
    pub amqp_url_set: bool,
    /// `QUEUE_STATUS` (`on`, the default, or `off`): whether the command line records
    /// each job's status and result (see [`crate::status`]).
    pub status: bool,
    /// `AMQP_QUEUE_TYPE` (`quorum`, the default, or `classic`): the kind of the queues
    /// the RabbitMQ transport declares.
    pub amqp_classic_queues: bool,
    /// `QUEUE_CONNECT_TIMEOUT`: how long one attempt to open a connection (TCP, TLS
    /// and login) may take before it fails naming the host, port and cause.
    pub connect_timeout: Duration,
    /// `QUEUE_WATCH`: how often MySQL's and SQLite's publish watch looks for other
    /// processes' publishes to wake idle workers (`off`: only the workers' polling);
    /// `None` keeps each transport's default (MySQL 20 ms, SQLite 2 ms).
    pub watch: Option<Option<Duration>>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            backend: BackendKind::Exec,
            database_url: SecretUrl::new(Self::DEFAULT_DATABASE_URL),
            amqp_url: SecretUrl::new(Self::DEFAULT_AMQP_URL),
            claim: ClaimStrategy::SkipLocked,
            canary_percent: 0,
            visibility_timeout: DEFAULT_VISIBILITY_TIMEOUT,
            table: Identifier::new("QUEUE_TABLE", Self::DEFAULT_TABLE)
                .expect("the default table name is a valid identifier"),
            schema: None,
            tenant: None,
            tenants: None,
            drain: DrainSetting::Detect,
            database_url_set: false,
            amqp_url_set: false,
            status: true,
            amqp_classic_queues: false,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            watch: None,
        }
    }
}

impl Config {
    /// `DATABASE_URL` when unset: a file next to the working directory.
    pub const DEFAULT_DATABASE_URL: &'static str = "sqlite://switchyard.db";
    /// `AMQP_URL` when unset.
    pub const DEFAULT_AMQP_URL: &'static str = "amqp://guest:guest@127.0.0.1:5672/%2f";
    /// `QUEUE_CONNECT_TIMEOUT` when unset: long enough for a TLS handshake across a
    /// continent, short enough that a wrong host is reported before anyone wonders.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    /// `QUEUE_TABLE` when unset.
    pub const DEFAULT_TABLE: &'static str = "switchyard_jobs";

    /// The backend workers also drain besides `backend`: the one `QUEUE_DRAIN` names
    /// (unless it is `backend` itself), or, when unset, the other backend if its URL is
    /// configured. A canary (`QUEUE_CANARY_PERCENT` above 0) uses the other backend in
    /// any case.
    pub fn drain_from(&self) -> Option<BackendKind> {
        match self.drain {
            DrainSetting::From(kind) if kind != self.backend => Some(kind),
            DrainSetting::From(_) | DrainSetting::Off => None,
            DrainSetting::Detect => {
                let other_set = match self.backend {
                    BackendKind::Exec => self.amqp_url_set,
                    BackendKind::RabbitMq => self.database_url_set,
                };
                other_set.then(|| self.backend.other())
            }
        }
    }

    /// Whether a migration is under way: a canary, or a backend being drained.
    pub fn migrating(&self) -> bool {
        self.canary_percent > 0 || self.drain_from().is_some()
    }

    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the configuration through `lookup` (variable name → value). Empty values
    /// count as unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let mut cfg = Config::default();
        if let Some(v) = get("QUEUE_BACKEND") {
            cfg.backend = v.trim().parse()?;
        }
        if let Some(v) = get("DATABASE_URL") {
            // A URL that takes the tenant's name is checked with a name in its place.
            validate_database_url(&tenants::fill(v.trim(), "tenant"))?;
            cfg.database_url = SecretUrl::new(v.trim());
            cfg.database_url_set = true;
        }
        if let Some(v) = get("AMQP_URL") {
            validate_amqp_url(&tenants::fill(v.trim(), "tenant"))?;
            cfg.amqp_url = SecretUrl::new(v.trim());
            cfg.amqp_url_set = true;
        }
        if let Some(v) = get("QUEUE_DRAIN") {
            cfg.drain = v.trim().parse()?;
        }
        if let Some(v) = get("QUEUE_CLAIM") {
            cfg.claim = v.trim().parse()?;
        }
        if let Some(v) = get("QUEUE_CANARY_PERCENT") {
            cfg.canary_percent = v
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= 100)
                .ok_or_else(|| {
                    ConfigError::new(
                        "QUEUE_CANARY_PERCENT",
                        Some(v.clone()),
                        "expected a whole number from 0 to 100",
                    )
                })?;
        }
        if let Some(v) = get("QUEUE_VISIBILITY_TIMEOUT") {
            cfg.visibility_timeout = duration_in(
                "QUEUE_VISIBILITY_TIMEOUT",
                v,
                Duration::from_secs(1)..=Duration::MAX,
                "expected a duration of at least 1s, such as 30s, 90s or 5m",
            )?;
        }
        if let Some(v) = get("QUEUE_CONNECT_TIMEOUT") {
            cfg.connect_timeout = duration_in(
                "QUEUE_CONNECT_TIMEOUT",
                v,
                Duration::from_millis(100)..=Duration::from_secs(600),
                "expected a duration from 100ms to 10m, such as 2s or 30s",
            )?;
        }
        if let Some(v) = get("QUEUE_WATCH") {
            cfg.watch = Some(if v.trim().eq_ignore_ascii_case("off") {
                None
            } else {
                Some(duration_in(
                    "QUEUE_WATCH",
                    v,
                    Duration::from_millis(1)..=Duration::from_secs(60),
                    "expected off, or a duration from 1ms to 60s, such as 2ms or 20ms",
                )?)
            });
        }
        if let Some(v) = get("QUEUE_TABLE") {
            cfg.table = Identifier::table("QUEUE_TABLE", v.trim())?;
        }
        if let Some(v) = get("QUEUE_STATUS") {
            cfg.status = either("QUEUE_STATUS", v, ["on", "off"])?;
        }
        if let Some(v) = get("QUEUE_SCHEMA") {
            cfg.tenants = TenantSelection::parse("QUEUE_SCHEMA", v.trim())?;
            if cfg.tenants.is_none() {
                cfg.tenant = Some(Identifier::new("QUEUE_SCHEMA", v.trim())?);
            }
        }
        if let Some(v) = get("AMQP_QUEUE_TYPE") {
            cfg.amqp_classic_queues = !either("AMQP_QUEUE_TYPE", v, ["quorum", "classic"])?;
        }
        cfg.check_tenants()?;
        Ok(match cfg.tenant.clone() {
            Some(tenant) => cfg.for_tenant(&tenant),
            None => cfg,
        })
    }

    /// The configuration of one tenant: `QUEUE_SCHEMA` set to it, and its name in
    /// place of `{tenant}` in the URLs that say it (see [`crate::tenants`]).
    pub fn for_tenant(&self, tenant: &Identifier) -> Config {
        let db_template = tenants::is_template(self.database_url.expose());
        let mut one = self.clone();
        one.tenants = None;
        one.tenant = Some(tenant.clone());
        one.schema = (!db_template).then(|| tenant.clone());
        one.database_url =
            SecretUrl::new(tenants::fill(self.database_url.expose(), tenant.as_str()));
        one.amqp_url = SecretUrl::new(tenants::fill(self.amqp_url.expose(), tenant.as_str()));
        one
    }

    /// The URLs say `{tenant}` only where `QUEUE_SCHEMA` gives tenants, and several
    /// tenants never share a SQLite file or a RabbitMQ vhost.
    fn check_tenants(&self) -> Result<(), ConfigError> {
        let named = self.tenant.is_some() || self.tenants.is_some();
        for (setting, url, set) in [
            ("DATABASE_URL", &self.database_url, self.database_url_set),
            ("AMQP_URL", &self.amqp_url, self.amqp_url_set),
        ] {
            if set && tenants::is_template(url.expose()) && !named {
                return Err(ConfigError::new(
                    setting,
                    Some(url.to_string()),
                    "a URL without {tenant}, or QUEUE_SCHEMA (--schema) naming the tenants whose names go there",
                ));
            }
            if set && tenants::is_template(url.expose()) && !tenants::in_path(url.expose()) {
                return Err(ConfigError::new(
                    setting,
                    Some(url.to_string()),
                    "{tenant} only in the URL's path (the SQLite file, the database or the vhost), where each tenant gets a store of its own; elsewhere (the user, a query parameter) the tenants would share one",
                ));
            }
        }
        let Some(selection) = &self.tenants else {
            return Ok(());
        };
        let sqlite = self.database_url.scheme() == "sqlite";
        // (A `{tenant}` anywhere but the path was refused above.)
        let sql_used = self.backend == BackendKind::Exec
            || self.drain_from() == Some(BackendKind::Exec)
            || self.database_url_set;
        if sqlite && sql_used && !tenants::is_template(self.database_url.expose()) {
            return Err(ConfigError::new(
                "QUEUE_SCHEMA",
                Some(selection.to_string()),
                "one tenant per SQLite file: put {tenant} in DATABASE_URL's path (sqlite://data/{tenant}.db), or name one tenant",
            ));
        }
        let amqp_used = self.backend == BackendKind::RabbitMq
            || self.drain_from() == Some(BackendKind::RabbitMq)
            || self.canary_percent > 0;
        if amqp_used && !tenants::is_template(self.amqp_url.expose()) {
            return Err(ConfigError::new(
                "QUEUE_SCHEMA",
                Some(selection.to_string()),
                "one tenant per RabbitMQ vhost: put {tenant} as AMQP_URL's vhost (amqp://USER:PASSWORD@HOST/{tenant}), or name one tenant",
            ));
        }
        Ok(())
    }
}

const DATABASE_URL_FORMS: &str =
    "expected sqlite://PATH (or sqlite::memory:), postgres://USER@HOST/DB or mysql://USER@HOST/DB";

fn validate_database_url(url: &str) -> Result<SecretUrl, ConfigError> {
    let bad = || ConfigError::new("DATABASE_URL", Some(redact_url(url)), DATABASE_URL_FORMS);
    let (scheme, rest) = url.split_once(':').ok_or_else(bad)?;
    match scheme.to_ascii_lowercase().as_str() {
        "sqlite" => {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() || path.starts_with('?') {
                return Err(bad());
            }
        }
        "postgres" | "postgresql" | "mysql" | "mariadb" => {
            let parsed = url::Url::parse(url).map_err(|_| bad())?;
            if !rest.starts_with("//") || parsed.host_str().is_none_or(str::is_empty) {
                return Err(bad());
            }
        }
        _ => return Err(bad()),
    }
    Ok(SecretUrl::new(url))
}

fn validate_amqp_url(url: &str) -> Result<SecretUrl, ConfigError> {
    // One broker, or the nodes of a cluster, comma-separated.
    let ok = crate::redact::split_url_list(url).iter().all(|one| {
        url::Url::parse(one).is_ok_and(|u| {
            matches!(u.scheme(), "amqp" | "amqps") && u.host_str().is_some_and(|h| !h.is_empty())
        })
    });
    if ok {
        Ok(SecretUrl::new(url))
    } else {
        Err(ConfigError::new(
            "AMQP_URL",
            Some(redact_url(url)),
            "expected amqp://USER:PASSWORD@HOST:PORT/VHOST or amqps://…, or several (the nodes of a cluster) separated by commas",
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn from(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_follow_the_contract() {
        let cfg = from(&[]).expect("defaults");
        assert_eq!(cfg.backend, BackendKind::Exec);
        assert_eq!(cfg.database_url.expose(), "sqlite://switchyard.db");
        assert_eq!(cfg.claim, ClaimStrategy::SkipLocked);
        assert_eq!(cfg.visibility_timeout, Duration::from_secs(90));
        assert_eq!(cfg.table.as_str(), "switchyard_jobs");
        assert_eq!(cfg.schema, None);
        assert_eq!(cfg.canary_percent, 0);
    }

    #[test]
    fn every_variable_is_read() {
        let cfg = from(&[
            ("QUEUE_BACKEND", "rabbitmq"),
            ("DATABASE_URL", "postgres://app:pw@db:5432/prod"),
            ("AMQP_URL", "amqp://u:p@mq:5672/vh"),
            ("QUEUE_CLAIM", "optimistic"),
            ("QUEUE_CANARY_PERCENT", "10"),
            ("QUEUE_VISIBILITY_TIMEOUT", "5m"),
            ("QUEUE_TABLE", "tenant_a_jobs"),
            ("QUEUE_SCHEMA", "tenant_a"),
        ])
        .expect("valid");
        assert_eq!(cfg.backend, BackendKind::RabbitMq);
        assert_eq!(cfg.claim, ClaimStrategy::Optimistic);
        assert_eq!(cfg.canary_percent, 10);
        assert_eq!(cfg.visibility_timeout, Duration::from_secs(300));
        assert_eq!(cfg.schema.as_ref().map(|s| s.as_str()), Some("tenant_a"));
        assert!(!format!("{cfg:?}").contains("pw@"));
    }

    #[test]
    fn one_tenant_goes_into_the_schema_or_where_a_url_says_tenant() {
        let pg = from(&[
            ("DATABASE_URL", "postgres://app@db/prod"),
            ("QUEUE_SCHEMA", "acme"),
        ])
        .expect("valid");
        assert_eq!(pg.tenant.as_ref().map(|t| t.as_str()), Some("acme"));
        assert_eq!(pg.schema.as_ref().map(|s| s.as_str()), Some("acme"));
        let file = from(&[
            ("DATABASE_URL", "sqlite://data/{tenant}.db"),
            ("AMQP_URL", "amqp://u:p@mq/{tenant}"),
            ("QUEUE_SCHEMA", "acme"),
        ])
        .expect("valid");
        assert_eq!(file.schema, None, "the file is the tenant's, not a schema");
        assert_eq!(file.database_url.expose(), "sqlite://data/acme.db");
        assert_eq!(file.amqp_url.expose(), "amqp://u:p@mq/acme");
    }

    #[test]
    fn several_tenants_each_get_their_own_configuration() {
        let cfg = from(&[
            ("DATABASE_URL", "sqlite://data/{tenant}.db"),
            ("QUEUE_SCHEMA", "a,b"),
        ])
        .expect("valid");
        assert_eq!(cfg.tenant, None);
        let selection = cfg.tenants.clone().expect("several");
        let b = cfg.for_tenant(&selection.names[1]);
        assert_eq!(b.tenant.as_ref().map(|t| t.as_str()), Some("b"));
        assert_eq!(b.database_url.expose(), "sqlite://data/b.db");
        assert!(b.tenants.is_none());
    }

    #[test]
    fn tenants_never_share_a_file_or_a_vhost() {
        let cases: [&[(&str, &str)]; 4] = [
            &[
                ("DATABASE_URL", "sqlite://jobs.db"),
                ("QUEUE_SCHEMA", "a,b"),
            ],
            &[
                ("QUEUE_BACKEND", "rabbitmq"),
                ("AMQP_URL", "amqp://u:p@mq/%2f"),
                ("QUEUE_SCHEMA", "a_*"),
            ],
            &[("DATABASE_URL", "sqlite://{tenant}.db")],
            &[("AMQP_URL", "amqp://u:p@mq/{tenant}")],
        ];
        for pairs in cases {
            let err = from(pairs).expect_err("refused").to_string();
            assert!(err.contains("{tenant}"), "{pairs:?}: {err}");
        }
    }

    #[test]
    fn bad_values_name_the_variable_the_value_and_the_accepted_values() {
        let cases = [
            ("QUEUE_BACKEND", "kafka", "expected exec or rabbitmq"),
            ("QUEUE_CLAIM", "fast", "skip-locked or optimistic"),
            ("QUEUE_CANARY_PERCENT", "101", "0 to 100"),
            ("QUEUE_VISIBILITY_TIMEOUT", "soon", "250ms, 10s"),
            ("QUEUE_VISIBILITY_TIMEOUT", "10ms", "at least 1s"),
            ("QUEUE_TABLE", "jobs;drop", "bare SQL identifier"),
            ("QUEUE_SCHEMA", "a-b", "bare SQL identifier"),
            ("DATABASE_URL", "postgres//x", "expected sqlite://"),
            ("DATABASE_URL", "oracle://db/x", "expected sqlite://"),
            ("DATABASE_URL", "sqlite://", "expected sqlite://"),
            ("AMQP_URL", "http://x", "amqp://"),
            ("AMQP_URL", "amqp://g@a/v,http://b", "separated by commas"),
            ("QUEUE_CONNECT_TIMEOUT", "50ms", "from 100ms to 10m"),
            ("QUEUE_CONNECT_TIMEOUT", "now", "250ms, 10s"),
        ];
        for (var, value, expected) in cases {
            let err = from(&[(var, value)]).unwrap_err();
            let text = err.to_string();
            assert!(text.contains(var), "{text}");
            assert!(text.contains(value), "{text}");
            assert!(text.contains(expected), "{text}");
        }
    }

    #[test]
    fn the_publish_watch_is_an_interval_or_off() {
        assert_eq!(from(&[]).expect("defaults").watch, None);
        let every = from(&[("QUEUE_WATCH", "5ms")]).expect("an interval");
        assert_eq!(every.watch, Some(Some(Duration::from_millis(5))));
        assert_eq!(
            from(&[("QUEUE_WATCH", "off")]).expect("off").watch,
            Some(None)
        );
        let e = from(&[("QUEUE_WATCH", "0ms")]).expect_err("too short");
        assert!(e.to_string().contains("QUEUE_WATCH"), "{e}");
    }

    #[test]
    fn a_cluster_and_a_connect_timeout_are_read() {
        let cfg = from(&[
            ("AMQP_URL", "amqps://u:p@a:5671/v,amqps://u:p@b:5671/v"),
            ("QUEUE_CONNECT_TIMEOUT", "2s"),
        ])
        .expect("a list of nodes and a timeout");
        assert_eq!(cfg.connect_timeout, Duration::from_secs(2));
        assert_eq!(
            from(&[]).expect("defaults").connect_timeout,
            Config::DEFAULT_CONNECT_TIMEOUT
        );
    }

    #[test]
    fn database_url_errors_redact_the_password() {
        let err = from(&[("DATABASE_URL", "oracle://u:hunter2@db/x")]).unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn durations_use_the_contract_units() {
        for (text, secs) in [
            ("250ms", 0.25),
            ("10s", 10.0),
            ("5m", 300.0),
            ("1h", 3600.0),
            ("30d", 2_592_000.0),
        ] {
            assert_eq!(
                parse_duration("--delay", text).expect(text).as_secs_f64(),
                secs
            );
        }
        assert!(parse_duration("--delay", "5 parsecs").is_err());
    }
}
