//! Throwaway PostgreSQL servers of the tests' own: `initdb` into a temporary directory,
//! a port and socket directory of their own, so that stopping, restarting, failing over
//! or demoting one cannot disturb the rest of the suite.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The directory of `initdb` and `pg_ctl`: `SWITCHYARD_PG_BIN`, or the newest
/// `/usr/lib/postgresql/*/bin` (Debian's layout).
pub fn pg_bin() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("SWITCHYARD_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// `None` when the PostgreSQL tools are installed; otherwise the test skips, saying
/// why (a failure under `CI=true`).
pub fn skip_without_tools(what: &str) -> bool {
    if pg_bin().is_some() {
        return false;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "no initdb found (install postgresql); under CI=true this is a failure"
    );
    eprintln!("SKIPPED: {what}: no initdb found (install postgresql)");
    true
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A server of our own; stopped (immediately) when dropped.
pub struct Server {
    pub bin: PathBuf,
    pub data: PathBuf,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    /// PostgreSQL refuses to run as root, so as root it runs as the `postgres` user.
    pub fn command(&self, program: &str) -> Command {
        command(&self.bin, program)
    }

    fn empty() -> Self {
        let bin = pg_bin().expect("initdb: install postgresql or set SWITCHYARD_PG_BIN");
        let dir = tempfile::tempdir().expect("a temporary directory");
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(status.success(), "chown the server directory to postgres");
        }
        Server {
            bin,
            data: dir.path().join("data"),
            port: free_port(),
            _dir: dir,
        }
    }

    /// A new cluster (`initdb`, trust for local and replication connections), started.
    pub fn start() -> Self {
        let server = Server::empty();
        run(server
            .command("initdb")
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(&server.data));
        server.start_on(server.port);
        server
    }

    /// A hot standby of `primary` (`pg_basebackup -R`, streaming), started on a port
    /// of its own.
    pub fn standby_of(primary: &Server) -> Self {
        let server = Server::empty();
        run(server
            .command("pg_basebackup")
            .args(["-h", "127.0.0.1", "-p", &primary.port.to_string()])
            .args(["-U", "postgres", "-X", "stream", "-R", "--no-sync", "-D"])
            .arg(&server.data));
        server.start_on(server.port);
        server
    }

    /// Starts the server on `port` (and waits until it accepts connections).
    pub fn start_on(&self, port: u16) {
        let socket_dir = self.data.parent().unwrap_or(Path::new("/tmp")).to_owned();
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(self.data.join("server.log"))
            .arg("-o")
            .arg(format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1",
                socket_dir.display()
            ))
            .args(["-w", "start"]));
    }

    /// `pg_ctl -m MODE stop`.
    pub fn stop(&self, mode: &str) {
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", mode, "-w", "stop"]));
    }

    /// Promotes a standby to primary (and waits until it is one).
    pub fn promote(&self) {
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "promote"]));
    }

    pub fn url(&self) -> String {
        self.url_on(self.port)
    }

    pub fn url_on(&self, port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

pub fn command(bin: &Path, program: &str) -> Command {
    let path = bin.join(program);
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(path);
        c
    } else {
        Command::new(path)
    }
}

/// Runs a PostgreSQL tool to completion. Its output goes to a file, not a pipe: the
/// server that `pg_ctl` starts inherits the tool's descriptors and would hold a pipe open
/// for ever.
pub fn run(cmd: &mut Command) {
    let log = tempfile::NamedTempFile::new().expect("a log file");
    let status = cmd
        .stdin(Stdio::null())
        .stdout(log.reopen().expect("log"))
        .stderr(log.reopen().expect("log"))
        .status()
        .expect("run a PostgreSQL tool");
    assert!(
        status.success(),
        "{cmd:?} failed: {}",
        std::fs::read_to_string(log.path()).unwrap_or_default()
    );
}
