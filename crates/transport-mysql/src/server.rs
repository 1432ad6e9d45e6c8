//! What the server is, and what that allows.

/// The server a transport talks to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// `VERSION()` as the server reports it.
    pub version: String,
    /// MariaDB rather than MySQL.
    pub mariadb: bool,
    /// Whether it has `FOR UPDATE SKIP LOCKED` (MySQL 8.0.1+, MariaDB 10.6+).
    pub skip_locked: bool,
}

impl ServerInfo {
    /// Reads `VERSION()` (`8.0.36`, `10.11.19-MariaDB-0+deb12u1`).
    pub fn parse(version: &str) -> Self {
        let mariadb = version.to_ascii_lowercase().contains("mariadb");
        let mut parts = version
            .split(|c: char| !c.is_ascii_digit())
            .filter(|p| !p.is_empty())
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor, patch) = (
            parts.next().unwrap_or(0),
            parts.next().unwrap_or(0),
            parts.next().unwrap_or(0),
        );
        let skip_locked = if mariadb {
            (major, minor) >= (10, 6)
        } else {
            (major, minor, patch) >= (8, 0, 1)
        };
        ServerInfo {
            version: version.to_owned(),
            mariadb,
            skip_locked,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_versions_tell_whether_skip_locked_exists() {
        let cases = [
            ("10.11.19-MariaDB-0+deb12u1", true, true),
            ("10.5.23-MariaDB", true, false),
            ("10.6.0-MariaDB-log", true, true),
            ("8.0.36", false, true),
            ("8.0.0-dmr", false, false),
            ("5.7.44-log", false, false),
        ];
        for (version, mariadb, skip) in cases {
            let info = ServerInfo::parse(version);
            assert_eq!(
                (info.mariadb, info.skip_locked),
                (mariadb, skip),
                "{version}"
            );
        }
    }
}
