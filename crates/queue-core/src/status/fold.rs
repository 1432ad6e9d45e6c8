//! The rule by which one update replaces another, and the folding of a batch by it.

use std::collections::HashMap;

use uuid::Uuid;

use super::update::StatusUpdate;
use crate::job_state::JobState;

/// Whether `new` may replace a record in `state` at `attempts`: a later attempt always
/// may; the same attempt only while the job is unfinished (a stray progress report
/// after `completed` or `dead` changes nothing); and the first start of a job that had
/// ended (its dead letter was replayed, or its id published again after it completed:
/// either counts attempts from zero again). Every store applies the same rule in SQL.
pub fn supersedes(state: JobState, attempts: u32, new: &StatusUpdate) -> bool {
    new.attempts > attempts
        || (new.attempts == attempts && !state.is_final())
        || (state.is_final() && new.is_first_start())
}

/// Folds a batch so that each id appears at most once among creations and once among
/// changes (PostgreSQL refuses an upsert that touches a row twice): the first creation
/// of an id wins, and a later change of an id that [`supersedes`] the earlier one
/// overrides it field by field. Both lists are sorted by id, so that two writers'
/// batches lock rows in the same order and cannot deadlock.
pub fn fold_updates(updates: &[StatusUpdate]) -> (Vec<StatusUpdate>, Vec<StatusUpdate>) {
    let mut creates: Vec<StatusUpdate> = Vec::new();
    let mut created: HashMap<Uuid, ()> = HashMap::new();
    let mut changes: Vec<StatusUpdate> = Vec::new();
    let mut at: HashMap<Uuid, usize> = HashMap::new();
    for u in updates {
        if u.create_only {
            if created.insert(u.id, ()).is_none() {
                creates.push(u.clone());
            }
            continue;
        }
        match at.get(&u.id) {
            Some(&i) => {
                let old = &mut changes[i];
                if !supersedes(old.state, old.attempts, u) {
                    continue;
                }
                let progress = u.progress.clone().or_else(|| old.progress.take());
                let error = u.error.clone().or_else(|| old.error.take());
                // A run's start folded with its ending still begins a run.
                let starts_run = old.starts_run || u.starts_run;
                let payload = u.payload.clone().or_else(|| old.payload.take());
                let worker = u.worker.clone().or_else(|| old.worker.take());
                // The same attempt's start folded with its ending: the start's own stamp
                // (how long before the write it was sent) dates it; without one, the
                // ending's run time; or else the start itself (written now).
                let same = u.attempts == old.attempts;
                let started = u.started || (same && old.started);
                let ran_for = match (same && old.started, old.ran_for) {
                    (true, Some(stamp)) => Some(stamp),
                    _ => u.ran_for.or(if same { old.ran_for } else { None }),
                };
                *old = StatusUpdate {
                    progress,
                    error,
                    starts_run,
                    payload,
                    worker,
                    started,
                    ran_for,
                    ..u.clone()
                };
            }
            None => {
                at.insert(u.id, changes.len());
                changes.push(u.clone());
            }
        }
    }
    creates.sort_by_key(|u| u.id);
    changes.sort_by_key(|u| u.id);
    (creates, changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::Envelope;

    fn env() -> Envelope {
        Envelope::builder("q", "k").build().expect("an envelope")
    }

    #[test]
    fn states_round_trip_their_names() {
        for s in JobState::ALL {
            assert_eq!(JobState::parse(s.as_str()), Some(s));
        }
        assert_eq!(JobState::parse("done"), None);
        assert!(JobState::Dead.is_final() && !JobState::Retrying.is_final());
    }

    #[test]
    fn folding_keeps_one_change_per_id_and_drops_older_attempts() {
        let e = env();
        let updates = vec![
            StatusUpdate::published(&e),
            StatusUpdate::published(&e),
            StatusUpdate::running(&e, 2),
            StatusUpdate::progress(&e, 2, 40, Some("half".into())),
            StatusUpdate::ended(&e, 1, JobState::Retrying, Some("stale")),
            StatusUpdate::ended(&e, 2, JobState::Retrying, Some("boom")),
        ];
        let (creates, changes) = fold_updates(&updates);
        assert_eq!(creates.len(), 1);
        assert_eq!(changes.len(), 1);
        let c = &changes[0];
        assert_eq!(c.state, JobState::Retrying);
        assert_eq!(c.attempts, 2);
        assert_eq!(c.progress, Some((40, Some("half".into()))));
        assert_eq!(c.error.as_deref(), Some("boom"));
    }

    #[test]
    fn a_start_folded_with_its_ending_is_dated_by_its_own_stamp() {
        let e = env();
        let mut start = StatusUpdate::running(&e, 1);
        start.ran_for = Some(std::time::Duration::from_millis(90));
        let end = StatusUpdate::completed(&e, 1, None).after(std::time::Duration::from_millis(5));
        let (_, changes) = fold_updates(&[start, end.clone()]);
        assert_eq!(
            changes[0].ran_for,
            Some(std::time::Duration::from_millis(90))
        );
        assert!(changes[0].started);
        // Without the writer's stamp, the ending's run time dates the start.
        let (_, changes) = fold_updates(&[StatusUpdate::running(&e, 1), end]);
        assert_eq!(
            changes[0].ran_for,
            Some(std::time::Duration::from_millis(5))
        );
    }
}
