//! Built-in maintenance run as schedules: a schedule whose kind is reserved
//! (`switchyard.prune`) publishes no job; at each slot the one worker that moves its
//! cursor runs the work in process. Its cadence and settings are the schedule's, so an
//! operator changes them like any schedule's (`schedule add switchyard.prune …`).

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::cadence::Cadence;
use super::{CatchUp, Schedule};
use crate::dead_letters::DeadSelection;
use crate::error::{Error, Result};
use crate::status::StatusStore;
use crate::transport::Transport;

/// The kinds reserved for built-in maintenance start with this.
pub const RESERVED_KIND_PREFIX: &str = "switchyard.";
/// The kind (and name) of the schedule that deletes finished job records and dead
/// letters older than its payload's `older_than`.
pub const PRUNE: &str = "switchyard.prune";

/// The settings of [`PRUNE`]: `{"older_than": "30d"}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PruneSettings {
    older_than: String,
}

/// What a maintenance slot runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Task {
    /// Deletes finished job records and dead letters older than this.
    Prune(Duration),
}

impl Schedule {
    /// The built-in schedule that deletes finished job records and dead letters older
    /// than `older_than`, at each slot of `cadence` (`work --prune-older-than` stores it
    /// hourly).
    pub fn prune(older_than: Duration, cadence: Cadence) -> Self {
        Schedule::new(PRUNE, cadence, "switchyard", PRUNE)
            .payload(serde_json::json!({
                "older_than": humantime::format_duration(older_than).to_string()
            }))
            .catch_up(CatchUp::Latest)
    }

    /// The maintenance this schedule runs instead of publishing a job, if its kind is
    /// reserved; an error names an unknown reserved kind or bad settings.
    pub(crate) fn task(&self) -> Result<Option<Task>> {
        if !self.kind.starts_with(RESERVED_KIND_PREFIX) {
            return Ok(None);
        }
        if self.kind != PRUNE {
            return Err(Error::InvalidInput(format!(
                "schedule {}: kind {:?} is reserved for built-in maintenance; accepted is {PRUNE:?} (with {{\"older_than\": \"30d\"}}), or a kind not starting with {RESERVED_KIND_PREFIX:?}",
                self.name, self.kind
            )));
        }
        let settings: PruneSettings =
            serde_json::from_value(self.payload.clone()).map_err(|e| {
                Error::InvalidInput(format!(
                    "schedule {}: {PRUNE} settings: {e}; accepted is {{\"older_than\": \"30d\"}}",
                    self.name
                ))
            })?;
        let older_than = humantime::parse_duration(&settings.older_than).map_err(|e| {
            Error::InvalidInput(format!(
                "schedule {}: older_than {:?}: {e}; accepted are durations such as \"30d\"",
                self.name, settings.older_than
            ))
        })?;
        Ok(Some(Task::Prune(older_than)))
    }
}

impl Task {
    /// Runs the task; what it did, for the log.
    pub(crate) async fn run(
        &self,
        transport: &Arc<dyn Transport>,
        status: Option<&Arc<dyn StatusStore>>,
    ) -> Result<String> {
        match self {
            Task::Prune(older_than) => {
                let (records, dead) = prune(transport, status, *older_than).await?;
                Ok(format!(
                    "pruned {records} job records and {dead} dead letters"
                ))
            }
        }
    }
}

/// Deletes finished job records, checkpoints and job logs (where there is a status store) and
/// dead letters older than `older_than`: how many records and dead letters.
pub async fn prune(
    transport: &Arc<dyn Transport>,
    status: Option<&Arc<dyn StatusStore>>,
    older_than: Duration,
) -> Result<(u64, u64)> {
    let records = match status {
        Some(store) => store.prune(older_than).await?,
        None => 0,
    };
    // A checkpoint or log this old belongs to a job long finished (or stuck past any
    // use).
    let window = i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX);
    let before = crate::time_units::now_us().saturating_sub(window);
    if let Some(checkpoints) = status.and_then(|s| s.checkpoints()) {
        let gone = checkpoints.prune(before).await?;
        if gone > 0 {
            tracing::info!(checkpoints = gone, "pruned old checkpoints");
        }
    }
    if let Some(logs) = status.and_then(|s| s.job_logs()) {
        let gone = logs.prune(before).await?;
        if gone > 0 {
            tracing::info!(logs = gone, "pruned old job logs");
        }
    }
    let dead = transport
        .dead_purge(None, &DeadSelection::OlderThan(older_than))
        .await?;
    Ok((records, dead))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_kinds_are_checked() {
        let hourly = Cadence::every(Duration::from_secs(3600)).expect("valid");
        let prune = Schedule::prune(Duration::from_secs(30 * 86_400), hourly.clone());
        assert_eq!(
            prune.task().expect("valid"),
            Some(Task::Prune(Duration::from_secs(30 * 86_400)))
        );
        let other = Schedule::new("x", hourly.clone(), "q", "switchyard.vacuum");
        let e = other.task().expect_err("reserved").to_string();
        assert!(e.contains("reserved") && e.contains(PRUNE), "{e}");
        let bad = Schedule::new("x", hourly.clone(), "q", PRUNE)
            .payload(serde_json::json!({"older_than": "soon"}));
        assert!(bad
            .task()
            .expect_err("bad duration")
            .to_string()
            .contains("\"soon\""));
        assert_eq!(
            Schedule::new("x", hourly, "q", "report")
                .task()
                .expect("valid"),
            None
        );
    }
}
