//! A throwaway three-node RabbitMQ cluster on this machine, for `tests/cluster.rs`.
//!
//! Nodes `sy-c1@localhost` … `sy-c3@localhost`, started with the broker's own program
//! (`rabbitmq-server -detached`, as the local broker is) and joined with `rabbitmqctl
//! join_cluster`. Each has its own AMQP port (5681-5683) and distribution port
//! (25681-25683) on loopback, its own configuration file (so that the local broker's
//! listeners in `/etc/rabbitmq/rabbitmq.conf`, 5672 and 5671, are not opened twice) and
//! no plugins (an empty enabled-plugins file: no management listener on 15672). Their
//! data and logs live in one fixed directory under the temporary directory, so that a
//! run can find and remove what a killed run left there. Every node shares the Erlang
//! cookie of the `rabbitmq` user, whose `HOME` Debian's wrappers switch to when run as
//! root, and so does `rabbitmqctl`.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Nodes in the cluster.
pub(crate) const NODES: usize = 3;
/// AMQP ports 5681-5683 and distribution ports 25681-25683: clear of the local broker's
/// 5671, 5672 and 25672, and of the CLI's (35672-35682).
const AMQP_PORT: u16 = 5681;
const DIST_PORT: u16 = 25681;
/// The longest one `rabbitmqctl` call may take: a node that hangs must not hang the test.
const CTL_TIMEOUT: &str = "90";

/// `sy-c1@localhost` for node 0, and so on.
pub(crate) fn node_name(i: usize) -> String {
    format!("sy-c{}@localhost", i + 1)
}

/// `127.0.0.1:PORT` of node `i`, as [`transport_amqp::AmqpTransport::connected_node`]
/// names it.
pub(crate) fn endpoint(i: usize) -> String {
    format!("127.0.0.1:{}", AMQP_PORT + i as u16)
}

/// Whether `rabbitmq-server` is on the `PATH`. Looked up, never run: the program with
/// any argument starts a broker.
pub(crate) fn installed() -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| dir.join("rabbitmq-server").is_file())
    })
}

/// Where the nodes keep their data and logs: fixed, so that leftovers can be found.
fn base_dir() -> PathBuf {
    std::env::temp_dir().join("switchyard-cluster-test")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `rabbitmqctl -n NODE ARGS`, bounded by [`CTL_TIMEOUT`].
fn ctl(node: &str, args: &[&str]) -> Output {
    Command::new("timeout")
        .args([CTL_TIMEOUT, "rabbitmqctl", "-n", node])
        .args(args)
        .output()
        .expect("run rabbitmqctl (coreutils' timeout and rabbitmqctl on the PATH)")
}

fn ctl_ok(node: &str, args: &[&str]) -> String {
    let out = ctl(node, args);
    assert!(
        out.status.success(),
        "rabbitmqctl -n {node} {args:?} failed: {}",
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Joins `node` (its app stopped) to `seed`'s cluster; a join that fails (an aborted
/// schema copy) is tried again from a reset node, three times in all.
fn join(node: &str, seed: &str) {
    let mut tries = 0;
    loop {
        tries += 1;
        let out = ctl(node, &["join_cluster", seed]);
        if out.status.success() {
            return;
        }
        assert!(
            tries < 3,
            "rabbitmqctl -n {node} join_cluster {seed} failed {tries} times: {}",
            text(&out)
        );
        eprintln!(
            "join_cluster failed, resetting {node} and trying again: {}",
            text(&out)
        );
        ctl_ok(node, &["reset"]);
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
}

fn json(what: &str, out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{what} is not JSON ({e}): {out}"))
}

/// Names (`sy-c1`, …) of the cluster's nodes that epmd knows, that is whose Erlang VM
/// is up.
pub(crate) fn registered_nodes() -> Vec<String> {
    let out = Command::new("epmd")
        .arg("-names")
        .output()
        .expect("run epmd -names (installed with Erlang)");
    let listing = String::from_utf8_lossy(&out.stdout);
    (0..NODES)
        .filter_map(|i| {
            let short = format!("sy-c{}", i + 1);
            let line = format!("name {short} at port");
            listing.contains(&line).then_some(short)
        })
        .collect()
}

/// Kills the VM of node `i` from its pid file, if that process is still that node's
/// (a pid is reused once its process is gone).
fn kill_from_pid_file(dir: &Path, i: usize) {
    let Ok(pid) = std::fs::read_to_string(dir.join(format!("node{i}.pid"))) else {
        return;
    };
    let pid = pid.trim();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    if String::from_utf8_lossy(&cmdline).contains(&node_name(i)) {
        let _ = Command::new("kill").args(["-KILL", pid]).status();
    }
}

/// Stops node `i` if it runs, and kills it if that fails.
fn stop_quietly(dir: &Path, i: usize) {
    let pid_file = dir.join(format!("node{i}.pid"));
    if registered_nodes().contains(&format!("sy-c{}", i + 1)) {
        let _ = ctl(&node_name(i), &["stop", &pid_file.to_string_lossy()]);
    }
    kill_from_pid_file(dir, i);
}

/// Three joined nodes; every node stopped and its files deleted when dropped (the files
/// kept when the test panicked, for their logs; the next run deletes them).
#[derive(Debug)]
pub(crate) struct Cluster {
    dir: PathBuf,
    running: Mutex<[bool; NODES]>,
}

impl Cluster {
    /// Starts three nodes and joins the second and third to the first.
    pub(crate) fn start() -> Self {
        let dir = base_dir();
        // What a killed earlier run left behind: its nodes, then their files.
        for i in 0..NODES {
            stop_quietly(&dir, i);
        }
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .unwrap_or_else(|e| panic!("remove the leftover {}: {e}", dir.display()));
        }
        std::fs::create_dir_all(dir.join("log")).expect("create the cluster's directory");
        std::fs::write(dir.join("enabled_plugins"), "[].\n").expect("write enabled_plugins");
        for i in 0..NODES {
            let port = AMQP_PORT + i as u16;
            // Our own file in place of /etc/rabbitmq's, whose listeners are the local
            // broker's: only this node's AMQP port, on loopback.
            std::fs::write(
                dir.join(format!("node{i}.conf")),
                format!("listeners.tcp.default = 127.0.0.1:{port}\n"),
            )
            .expect("write a node's configuration");
        }
        // The nodes run as `rabbitmq` (Debian's wrapper switches to it from root).
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "rabbitmq:rabbitmq"])
                .arg(&dir)
                .status()
                .expect("run chown");
            assert!(status.success(), "chown {} to rabbitmq", dir.display());
        }
        let cluster = Cluster {
            dir,
            running: Mutex::new([false; NODES]),
        };
        let started = Instant::now();
        // All three at once, so that their boots overlap (about 9 s of CPU each).
        for i in 0..NODES {
            cluster.spawn_node(i);
        }
        for i in 0..NODES {
            cluster.await_node(i);
        }
        let booted = started.elapsed();
        // One join at a time: two nodes joining at once can abort each other's schema
        // copy (RabbitMQ 3.10: `{aborted, {shutdown, … sync_dump_log, schema_prepare}}`).
        for i in 1..NODES {
            let node = node_name(i);
            ctl_ok(&node, &["stop_app"]);
            join(&node, &node_name(0));
            ctl_ok(&node, &["start_app"]);
        }
        let running = cluster.running_nodes(0);
        assert_eq!(running.len(), NODES, "a cluster of three: {running:?}");
        eprintln!(
            "cluster of {} up in {:.1?} (booted in {booted:.1?}; data and logs in {})",
            running.join(", "),
            started.elapsed(),
            cluster.dir.display()
        );
        cluster
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn set_running(&self, i: usize, up: bool) {
        if let Ok(mut running) = self.running.lock() {
            running[i] = up;
        }
    }

    /// `rabbitmq-server -detached` for node `i`, which returns before the node is up.
    fn spawn_node(&self, i: usize) {
        let out = Command::new("rabbitmq-server")
            .arg("-detached")
            .env("RABBITMQ_NODENAME", node_name(i))
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", (AMQP_PORT + i as u16).to_string())
            .env("RABBITMQ_DIST_PORT", (DIST_PORT + i as u16).to_string())
            .env("RABBITMQ_CONFIG_FILE", self.path(&format!("node{i}.conf")))
            // Absent, so that an /etc/rabbitmq/advanced.config would not apply either.
            .env(
                "RABBITMQ_ADVANCED_CONFIG_FILE",
                self.path("advanced.config"),
            )
            .env("RABBITMQ_MNESIA_BASE", self.path("mnesia"))
            .env("RABBITMQ_LOG_BASE", self.path("log"))
            .env("RABBITMQ_PID_FILE", self.path(&format!("node{i}.pid")))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                self.path("enabled_plugins"),
            )
            .env(
                "RABBITMQ_PLUGINS_EXPAND_DIR",
                self.path(&format!("plugins{i}")),
            )
            // Idle schedulers sleep rather than spin: three VMs and the test share two
            // cores.
            .env(
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                "+sbwt none +sbwtdcpu none +sbwtdio none",
            )
            .output()
            .expect("run rabbitmq-server");
        assert!(
            out.status.success(),
            "rabbitmq-server -detached for {}: {}",
            node_name(i),
            text(&out)
        );
        self.set_running(i, true);
    }

    /// Waits until node `i` has booted: its AMQP listener, opened at the end of the
    /// boot, accepts a connection, and then `await_startup` agrees. (`await_startup`
    /// alone fails at once while the node is not registered yet, and otherwise checks
    /// every ten seconds.)
    fn await_node(&self, i: usize) {
        let addr: SocketAddr = endpoint(i).parse().expect("a socket address");
        let deadline = Instant::now() + Duration::from_secs(90);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "{} did not open {addr} within 90 s; its log is in {}",
                node_name(i),
                self.path("log").display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        ctl_ok(&node_name(i), &["await_startup", "--timeout", "60"]);
    }

    /// Stops node `i` entirely, as `systemctl stop` would: `rabbitmqctl stop` with the
    /// pid file returns once its Erlang VM has exited.
    pub(crate) fn stop_node(&self, i: usize) {
        let pid_file = self.path(&format!("node{i}.pid"));
        ctl_ok(&node_name(i), &["stop", &pid_file.to_string_lossy()]);
        self.set_running(i, false);
    }

    /// The running nodes, as node `ask` sees them (`cluster_status`).
    pub(crate) fn running_nodes(&self, ask: usize) -> Vec<String> {
        let out = ctl_ok(&node_name(ask), &["cluster_status", "--formatter", "json"]);
        let status = json("cluster_status", &out);
        let mut running: Vec<String> = status["running_nodes"]
            .as_array()
            .map(|nodes| {
                nodes
                    .iter()
                    .filter_map(|n| n.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        running.sort();
        running
    }

    /// The leader of the quorum queue `queue` (a node's index) and its members, as node
    /// `ask` sees them.
    pub(crate) fn queue_leader(&self, ask: usize, queue: &str) -> (Option<usize>, Vec<String>) {
        let out = ctl_ok(
            &node_name(ask),
            &[
                "list_queues",
                "name",
                "leader",
                "members",
                "--formatter",
                "json",
            ],
        );
        let rows = json("list_queues", &out);
        let row = rows
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["name"] == queue))
            .unwrap_or_else(|| panic!("{queue} is not among the queues of {out}"));
        let leader = row["leader"].as_str().unwrap_or_default();
        let members = row["members"]
            .as_array()
            .map(|m| {
                m.iter()
                    .filter_map(|n| n.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        ((0..NODES).find(|&i| leader == node_name(i)), members)
    }

    /// What the broker says of its queues, asked of node `ask`: names, leaders, ready
    /// and unacknowledged counts and consumers, for a failure's message.
    pub(crate) fn queue_counts(&self, ask: usize) -> String {
        let out = ctl(
            &node_name(ask),
            &[
                "list_queues",
                "name",
                "leader",
                "messages_ready",
                "messages_unacknowledged",
                "consumers",
                "--formatter",
                "json",
            ],
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The leader of `queue`, waiting (up to a minute) for one on a node other than
    /// `not`, asking node `ask`: after a leader's loss the others elect a new one.
    pub(crate) fn leader_other_than(&self, ask: usize, queue: &str, not: usize) -> usize {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let (Some(leader), _) = self.queue_leader(ask, queue) {
                if leader != not {
                    return leader;
                }
            }
            assert!(
                Instant::now() < deadline,
                "{queue} has no leader besides {}",
                node_name(not)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Every node's URL, comma-separated, starting at node `first`.
    pub(crate) fn url_from(&self, first: usize) -> String {
        (0..NODES)
            .map(|k| format!("amqp://guest:guest@{}/%2f", endpoint((first + k) % NODES)))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let started = Instant::now();
        let running = self.running.lock().map(|r| *r).unwrap_or([true; NODES]);
        // Together: each stop waits for its VM to exit, a few seconds.
        std::thread::scope(|s| {
            for (i, up) in running.into_iter().enumerate() {
                if up {
                    let dir = &self.dir;
                    s.spawn(move || stop_quietly(dir, i));
                }
            }
        });
        eprintln!("cluster stopped in {:.1?}", started.elapsed());
        if std::thread::panicking() {
            eprintln!(
                "the cluster's nodes are stopped; their logs are kept in {}",
                self.path("log").display()
            );
        } else if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("could not remove {}: {e}", self.dir.display());
        }
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Whether the cluster's files are gone (after a drop).
pub(crate) fn files_removed() -> bool {
    !base_dir().exists()
}
