//! Printing: human text by default, JSON with `--json`, progress bars on terminals.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// `println!` that never panics: when stdout is a pipe whose reader left (`| head`) or a
/// closed terminal, the text is lost and the command goes on to its end (a worker keeps
/// its jobs, a publish publishes every line it read).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `eprintln!` that never panics, for the same reason as [`outln!`].
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// An error and its sources on one line, for the exit message.
pub(crate) fn one_line(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

static EXIT_CODE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(1);

/// The exit code of the error the command is about to return (1 unless set).
pub(crate) fn set_exit_code(code: u8) {
    EXIT_CODE.store(code, std::sync::atomic::Ordering::SeqCst);
}

/// The exit code for a command that failed.
pub(crate) fn exit_code() -> u8 {
    EXIT_CODE.load(std::sync::atomic::Ordering::SeqCst)
}

/// Prints one JSON value on its own line.
pub(crate) fn json_line(value: &impl serde::Serialize) -> switchyard::Result<()> {
    let text = serde_json::to_string(value)
        .map_err(|e| switchyard::Error::InvalidInput(format!("cannot encode output: {e}")))?;
    outln!("{text}");
    Ok(())
}

/// A progress bar on a terminal; hidden otherwise (pipes, CI, `--json`).
pub(crate) fn progress(total: u64, what: &str, json: bool) -> ProgressBar {
    if json || !std::io::stdout().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template(
        "{msg:>12} [{bar:40.cyan/blue}] {pos}/{len} ({per_sec}, eta {eta})",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_owned());
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// A duration for people: `850ms`, `12.3s`, `4m 05s`.
pub(crate) fn human_duration(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 1.0 {
        format!("{}ms", d.as_millis())
    } else if secs < 60.0 {
        format!("{secs:.1}s")
    } else if secs < 3600.0 {
        format!("{}m {:02}s", d.as_secs() / 60, d.as_secs() % 60)
    } else {
        format!("{}h {:02}m", d.as_secs() / 3600, d.as_secs() / 60 % 60)
    }
}
