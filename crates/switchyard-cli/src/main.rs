//! `switchyard`: the command-line tool of switchyard.

#[macro_use]
mod output;
mod alerts;
mod cli;
mod commands;
mod control_protocol;
mod host_guard;
mod job_view;
mod listen;
mod metrics_listener;
mod payload;
mod pruning;
mod signals;
mod tracing_export;

use std::process::ExitCode;

use std::io::IsTerminal;

use clap::error::ErrorKind;
use clap::Parser;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

/// clap's whole message: the flag that is missing or wrong, its "did you mean" tip and
/// the usage line. Help and version exit 0, mistakes 2.
fn usage_error(e: &clap::Error) -> ExitCode {
    // A closed stderr or stdout loses the text, nothing else.
    let _ = e.print();
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => ExitCode::SUCCESS,
        _ => ExitCode::from(2),
    }
}

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    // The demo and the benchmark report on their own; their expected failures would
    // only clutter the screen. RUST_LOG overrides.
    let quiet = matches!(cli.command, cli::Command::Demo(_) | cli::Command::Bench(_));
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        // lapin's connection loop logs each failed attempt as an error; the
        // transport reports the failure itself, in one line naming the node
        // and the cause (and warns at each reconnect). The transport also probes
        // queues with passive declarations (a queue's partitions, its dead-letter
        // queue), which the broker answers by closing the channel when the queue
        // is missing, and lapin logs that as an error too: an expected answer,
        // and real channel failures reach the transport's caller as errors.
        tracing_subscriber::EnvFilter::new(if quiet {
            "error,lapin::channel=off,lapin::io_loop=off"
        } else {
            "warn,lapin::channel=off,lapin::io_loop=off"
        })
    });
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Its own report of a failed write is an `eprintln!`, which panics when stderr
        // is a closed pipe (`work 2>&1 | head`): a lost log line must cost nothing more.
        .log_internal_errors(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(filter);
    let otlp = tracing_export::start();
    tracing_subscriber::registry()
        .with(log)
        .with(otlp.as_ref().map(tracing_export::layer))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            errln!("switchyard: error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(commands::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            errln!("switchyard: error: {}", output::one_line(&e));
            ExitCode::from(output::exit_code())
        }
    };
    // Tasks cut off at a hard stop end with the runtime: their spans close first.
    drop(runtime);
    tracing_export::stop(otlp);
    code
}
