//! `test-servers`: starts throwaway PostgreSQL, MariaDB and RabbitMQ containers with
//! testcontainers, runs a command with their URLs in `SWITCHYARD_TEST_PG_URL`,
//! `SWITCHYARD_TEST_MYSQL_URL` and `SWITCHYARD_TEST_AMQP_URL` (and the broker's
//! `rabbitmqctl` in `SWITCHYARD_TEST_RABBITMQCTL`), and removes the
//! containers when it ends (or on Ctrl-C / SIGTERM), exiting with the command's code.
//!
//! `scripts/test` uses it where a backend has no server and Docker answers:
//!
//! ```text
//! cargo run -q -p test-servers -- --only postgres,rabbitmq -- cargo nextest run --workspace
//! ```
//!
//! The images are the official ones by default and can be changed with
//! `SWITCHYARD_TEST_PG_IMAGE`, `SWITCHYARD_TEST_MYSQL_IMAGE` and
//! `SWITCHYARD_TEST_AMQP_IMAGE` (`name:tag`), for a registry mirror or for images built
//! locally (`scripts/build-test-images`).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use testcontainers::core::{ContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a server may take from container start to its first real answer.
const READY_WITHIN: Duration = Duration::from_secs(180);

#[derive(Parser, Debug)]
#[command(about = "Runs a command against throwaway database and broker containers")]
struct Args {
    /// The servers to start, comma-separated: postgres, mariadb, rabbitmq.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "postgres,mariadb,rabbitmq"
    )]
    only: Vec<Backend>,
    /// The command to run, after `--`.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// A server the suite needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Backend {
    Postgres,
    Mariadb,
    Rabbitmq,
}

impl Backend {
    /// The image setting and its default (the official image).
    fn image(self) -> (&'static str, &'static str) {
        match self {
            Backend::Postgres => ("SWITCHYARD_TEST_PG_IMAGE", "postgres:16"),
            Backend::Mariadb => ("SWITCHYARD_TEST_MYSQL_IMAGE", "mariadb:11"),
            Backend::Rabbitmq => ("SWITCHYARD_TEST_AMQP_IMAGE", "rabbitmq:3.13"),
        }
    }

    fn port(self) -> u16 {
        match self {
            Backend::Postgres => 5432,
            Backend::Mariadb => 3306,
            Backend::Rabbitmq => 5672,
        }
    }

    /// The official images' settings for a test server: trust, an empty root password,
    /// a `test` database (RabbitMQ's image lets guest in from outside by default).
    fn env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Backend::Postgres => &[
                ("POSTGRES_HOST_AUTH_METHOD", "trust"),
                ("POSTGRES_DB", "test"),
            ],
            Backend::Mariadb => &[
                ("MARIADB_ALLOW_EMPTY_ROOT_PASSWORD", "1"),
                ("MARIADB_DATABASE", "test"),
            ],
            Backend::Rabbitmq => &[],
        }
    }

    /// The variable the suite reads, and the URL of a server on `port`.
    fn url(self, port: u16) -> (&'static str, String) {
        match self {
            Backend::Postgres => (
                "SWITCHYARD_TEST_PG_URL",
                format!("postgres://postgres@127.0.0.1:{port}/test"),
            ),
            Backend::Mariadb => (
                "SWITCHYARD_TEST_MYSQL_URL",
                format!("mysql://root@127.0.0.1:{port}/test"),
            ),
            Backend::Rabbitmq => (
                "SWITCHYARD_TEST_AMQP_URL",
                format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
            ),
        }
    }

    /// A first protocol exchange: what a server sends or answers once it really serves
    /// (the official images answer on TCP only after their set-up is done).
    async fn answers(self, port: u16) -> bool {
        let Ok(Ok(mut s)) = tokio::time::timeout(
            Duration::from_secs(2),
            TcpStream::connect(("127.0.0.1", port)),
        )
        .await
        else {
            return false;
        };
        let mut buf = [0_u8; 8];
        let exchange = async {
            match self {
                // SSLRequest: the server answers `S` or `N`.
                Backend::Postgres => {
                    s.write_all(&[0, 0, 0, 8, 4, 210, 22, 47]).await?;
                    s.read_exact(&mut buf[..1]).await?;
                    Ok::<bool, std::io::Error>(matches!(buf[0], b'S' | b'N'))
                }
                // The server speaks first: a handshake packet of protocol version 10.
                Backend::Mariadb => {
                    s.read_exact(&mut buf[..5]).await?;
                    Ok(buf[4] == 10)
                }
                // The protocol header: the broker answers with a method frame.
                Backend::Rabbitmq => {
                    s.write_all(b"AMQP\x00\x00\x09\x01").await?;
                    s.read_exact(&mut buf[..1]).await?;
                    Ok(buf[0] == 1)
                }
            }
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(3), exchange).await,
            Ok(Ok(true))
        )
    }
}

/// One started server.
struct Started {
    backend: Backend,
    port: u16,
    container: ContainerAsync<GenericImage>,
}

async fn start(backend: Backend) -> Result<Started, String> {
    let (setting, default) = backend.image();
    let image = std::env::var(setting).unwrap_or_else(|_| default.to_owned());
    let (name, tag) = image.rsplit_once(':').unwrap_or((image.as_str(), "latest"));
    let mut request = GenericImage::new(name, tag)
        .with_exposed_port(ContainerPort::Tcp(backend.port()))
        .with_wait_for(WaitFor::Nothing)
        .with_startup_timeout(READY_WITHIN);
    for (k, v) in backend.env() {
        request = request.with_env_var(*k, *v);
    }
    let container = request.start().await.map_err(|e| {
        format!("{image} ({setting}) did not start: {e}; with no registry, build local images (scripts/build-test-images) and name them in {setting}")
    })?;
    let port = container
        .get_host_port_ipv4(backend.port())
        .await
        .map_err(|e| format!("{image}: no published port for {}: {e}", backend.port()))?;
    let deadline = Instant::now() + READY_WITHIN;
    while !backend.answers(port).await {
        if Instant::now() > deadline {
            return Err(format!(
                "{image} did not answer on 127.0.0.1:{port} within {READY_WITHIN:?} (docker logs {})",
                container.id()
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // RabbitMQ answers the header before its vhosts are ready; give it a moment more.
    if backend == Backend::Rabbitmq {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    eprintln!("test-servers: {image} ready on 127.0.0.1:{port}");
    Ok(Started {
        backend,
        port,
        container,
    })
}

async fn stop(started: Vec<Started>) {
    for s in started {
        let id = s.container.id().to_owned();
        if let Err(e) = s.container.rm().await {
            eprintln!("test-servers: could not remove container {id}: {e}");
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let mut started = Vec::new();
    for backend in &args.only {
        match start(*backend).await {
            Ok(s) => started.push(s),
            Err(e) => {
                eprintln!("test-servers: {e}");
                stop(started).await;
                return ExitCode::from(2);
            }
        }
    }
    let Some((program, rest)) = args.command.split_first() else {
        stop(started).await;
        return ExitCode::from(2);
    };
    let mut command = tokio::process::Command::new(program);
    command.args(rest);
    for s in &started {
        let (var, url) = s.backend.url(s.port);
        command.env(var, url);
        if s.backend == Backend::Rabbitmq {
            // For the tests that ask the broker itself (`rabbitmqctl close_connection`).
            command.env(
                "SWITCHYARD_TEST_RABBITMQCTL",
                format!("docker exec {} rabbitmqctl", s.container.id()),
            );
        }
    }
    let code = match command.spawn() {
        Err(e) => {
            eprintln!("test-servers: cannot run {program}: {e}");
            2
        }
        Ok(mut child) => {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("test-servers: cannot watch SIGTERM: {e}");
                        stop(started).await;
                        return ExitCode::from(2);
                    }
                };
            tokio::select! {
                status = child.wait() => match status {
                    Ok(status) => status.code().unwrap_or(1),
                    Err(e) => {
                        eprintln!("test-servers: waiting for {program}: {e}");
                        1
                    }
                },
                _ = tokio::signal::ctrl_c() => {
                    let _ = child.kill().await;
                    130
                }
                _ = term.recv() => {
                    let _ = child.kill().await;
                    143
                }
            }
        }
    };
    stop(started).await;
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
