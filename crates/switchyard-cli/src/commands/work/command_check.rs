//! `work --exec CMD` refuses to start when CMD's program cannot run, instead of
//! dead-lettering every message with exit status 127.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use switchyard::ConfigError;

/// Checks that the program `sh -c CMD` starts exists and may be executed: a path is
/// checked as a file, a bare name is looked up the way the shell will (`command -v`:
/// builtins, keywords and PATH). A program named through shell syntax (`$VAR`, quotes,
/// globs) is left to the shell.
pub(crate) fn check(command: &str) -> Result<(), ConfigError> {
    let bad = |expected: String| ConfigError::new("--exec", Some(command.to_owned()), expected);
    let Some(program) = program_of(command) else {
        return Err(bad(
            "a command to run once per message, such as ./handle.sh or 'python3 job.py'".into(),
        ));
    };
    if program.contains(['$', '`', '"', '\'', '\\', '*', '?', '[', '~', '{', '(']) {
        return Ok(());
    }
    if program.contains('/') {
        let path = Path::new(program);
        let meta = std::fs::metadata(path).map_err(|e| {
            let cwd = std::env::current_dir()
                .map(|d| format!(" (from {})", d.display()))
                .unwrap_or_default();
            bad(format!(
                "{program} cannot be read{cwd}: {e}; a path to an executable file, or a command on PATH"
            ))
        })?;
        if meta.is_dir() {
            return Err(bad(format!(
                "{program} is a directory; a path to an executable file"
            )));
        }
        if meta.permissions().mode() & 0o111 == 0 {
            return Err(bad(format!(
                "{program} is not executable (chmod +x {program}, or run it through its interpreter: sh {program})"
            )));
        }
        return Ok(());
    }
    let found = Command::new("sh")
        .args(["-c", "command -v -- \"$1\"", "sh", program])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| bad(format!("a shell to run it (sh could not be started: {e})")))?;
    if found.success() {
        Ok(())
    } else {
        Err(bad(format!(
            "{program} is not a command on PATH nor a shell builtin; a command on PATH, or a path such as ./{program}"
        )))
    }
}

/// The first word of a shell command that names a program: after any `NAME=value`
/// assignments, up to whitespace or an operator.
fn program_of(command: &str) -> Option<&str> {
    let mut rest = command.trim_start();
    loop {
        let end = rest
            .find(|c: char| c.is_whitespace() || ";|&<>".contains(c))
            .unwrap_or(rest.len());
        let word = &rest[..end];
        if word.is_empty() {
            return None;
        }
        if !is_assignment(word) {
            return Some(word);
        }
        rest = rest[end..].trim_start();
    }
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_is_the_first_word_after_assignments() {
        assert_eq!(program_of("./run.sh --fast"), Some("./run.sh"));
        assert_eq!(program_of("  A=1 B=2 python3 job.py"), Some("python3"));
        assert_eq!(program_of("sleep 0.02; echo done"), Some("sleep"));
        assert_eq!(program_of("cat|wc"), Some("cat"));
        assert_eq!(program_of("A=1"), None);
        assert_eq!(program_of("   "), None);
    }

    #[test]
    fn commands_that_cannot_run_are_named() {
        assert!(check("cat").is_ok());
        assert!(check("sleep 0.02; echo \"$SWITCHYARD_MESSAGE_ID\" >> log").is_ok());
        assert!(check("cd /tmp && ./x").is_ok(), "a builtin");
        assert!(check("\"$HOME/bin/x\"").is_ok(), "left to the shell");
        let e = check("./missing-handler.sh").expect_err("missing");
        assert!(
            e.to_string()
                .contains("./missing-handler.sh cannot be read"),
            "{e}"
        );
        let e = check("no-such-program-anywhere --x").expect_err("not on PATH");
        assert!(e.to_string().contains("not a command on PATH"), "{e}");
        let plain =
            std::env::temp_dir().join(format!("switchyard-check-{}.sh", std::process::id()));
        std::fs::write(&plain, "echo hi\n").expect("write a script");
        let e = check(&plain.display().to_string()).expect_err("not executable");
        let _ = std::fs::remove_file(&plain);
        assert!(e.to_string().contains("not executable"), "{e}");
        let e = check("/tmp").expect_err("a directory");
        assert!(e.to_string().contains("is a directory"), "{e}");
        assert!(check("").is_err());
    }
}
