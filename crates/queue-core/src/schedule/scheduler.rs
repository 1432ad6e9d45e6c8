//! Firing due slots: what every worker runs beside its claims (and what `schedule`
//! commands call), with no leader (see the module documentation of
//! [`schedule`](super)).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::maintenance::Task;
use super::plan::{plan, Plan};
use super::spec::ScheduleSpec;
use super::store::{PutOutcome, ScheduleStore, StoredSchedule};
use super::Schedule;
use crate::envelope::Envelope;
use crate::error::{Error, Result};
use crate::status::StatusStore;
use crate::time_units::now_us;
use crate::transport::Transport;

/// The longest a firing loop sleeps: a schedule added or resumed elsewhere is seen
/// within this.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// The wait after the store failed.
const STORE_DOWN_WAIT: Duration = Duration::from_secs(2);

/// Fires the due slots of a store's schedules through a transport.
#[derive(Debug, Clone)]
pub struct Scheduler {
    store: Arc<dyn ScheduleStore>,
    transport: Arc<dyn Transport>,
    tenant: Option<Arc<str>>,
    /// What built-in maintenance prunes besides the dead letters.
    status: Option<Arc<dyn StatusStore>>,
    /// Slot jobs whose publish failed, by (schedule, slot): published again as they were
    /// (a broker takes the same id for a retry; a fresh one would meet the slot's key,
    /// still held for the failed send, and the slot would be skipped as a duplicate).
    unsent: Arc<Mutex<HashMap<(String, i64), Envelope>>>,
    /// The last error logged per schedule: a schedule that cannot fire is logged once
    /// per error, not once a second by every worker.
    warned: Arc<Mutex<HashMap<String, String>>>,
}

/// What one look at the schedules did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FireReport {
    /// Slot jobs this look published that met no other job of their slot (on the SQL
    /// backends a job another worker stored under the same derived id counts here too:
    /// its publish is a no-op).
    pub stored: u64,
    /// Slot jobs whose slot's key another job held.
    pub duplicates: u64,
    /// Slots this look counted missed (as the worker that moved the cursor).
    pub missed: u64,
    /// The earliest next slot of the active schedules (µs).
    pub next: Option<i64>,
    /// Schedules that could not fire, with why.
    pub failed: Vec<(String, String)>,
}

/// A schedule as listed (`schedule list`, the dashboard).
#[derive(Debug, Clone, Serialize)]
pub struct ScheduleInfo {
    /// Its name.
    pub name: String,
    /// Its definition.
    pub spec: ScheduleSpec,
    /// Whether it is paused.
    pub paused: bool,
    /// Its slots up to this time were fired or counted missed.
    pub fired_through: Option<DateTime<Utc>>,
    /// Its next slot, unless paused.
    pub next_run: Option<DateTime<Utc>>,
    /// Why it cannot fire, when its stored definition no longer reads (a time zone the
    /// system does not know any more).
    pub error: Option<String>,
}

impl Scheduler {
    /// A scheduler of `store`'s schedules, publishing through `transport`.
    pub fn new(store: Arc<dyn ScheduleStore>, transport: Arc<dyn Transport>) -> Self {
        Scheduler {
            store,
            transport,
            tenant: None,
            status: None,
            unsent: Arc::default(),
            warned: Arc::default(),
        }
    }

    /// Gives built-in maintenance the job records to prune.
    pub fn with_status(mut self, status: Option<Arc<dyn StatusStore>>) -> Self {
        self.status = status;
        self
    }

    /// Labels its metrics with a tenant.
    pub fn with_tenant(mut self, tenant: Option<Arc<str>>) -> Self {
        self.tenant = tenant;
        self
    }

    /// Stores each schedule (adding it, or changing its definition and keeping its
    /// cursor); applying the same schedules again changes nothing.
    pub async fn apply(&self, schedules: &[Schedule]) -> Result<Vec<(String, PutOutcome)>> {
        let now = now_us();
        let mut seen = std::collections::HashSet::new();
        for s in schedules {
            s.validate()?;
            if !seen.insert(s.name.as_str()) {
                return Err(Error::InvalidInput(format!(
                    "schedule {} is defined twice; accepted is one definition per name",
                    s.name
                )));
            }
        }
        let stored: std::collections::HashMap<String, StoredSchedule> = self
            .store
            .list()
            .await?
            .into_iter()
            .map(|s| (s.name.clone(), s))
            .collect();
        let mut outcomes = Vec::with_capacity(schedules.len());
        for s in schedules {
            let spec = ScheduleSpec::of(s);
            let outcome = self.store.put(&s.name, &spec.to_json(), now).await?;
            // Slots of the old cadence are not the new one's: a schedule whose cadence
            // changed starts from now, as a new one does, rather than catch up slots
            // that never existed.
            if let (PutOutcome::Changed, Some(old)) = (outcome, stored.get(&s.name)) {
                let old_spec = ScheduleSpec::from_json(&old.spec).ok();
                let same_cadence = old_spec.is_some_and(|o| {
                    (&o.cron, &o.every, &o.timezone) == (&spec.cron, &spec.every, &spec.timezone)
                });
                if !same_cadence && old.fired_through < now {
                    self.store.advance(&s.name, old.fired_through, now).await?;
                }
            }
            outcomes.push((s.name.clone(), outcome));
        }
        Ok(outcomes)
    }

    /// Fires the slots due at `now` (µs) of every active schedule.
    pub async fn fire_due(&self, now: i64) -> Result<FireReport> {
        let mut report = FireReport::default();
        for stored in self.store.list().await? {
            if stored.paused {
                continue;
            }
            let outcome = self.fire_one(&stored, now, &mut report).await;
            let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
            match outcome {
                Ok(()) => {
                    warned.remove(&stored.name);
                }
                Err(e) => {
                    let text = e.to_string();
                    if warned.get(&stored.name) != Some(&text) {
                        tracing::warn!(schedule = %stored.name, error = %text, "a schedule could not fire; it tries again at each look");
                        warned.insert(stored.name.clone(), text.clone());
                    }
                    report.failed.push((stored.name.clone(), text));
                }
            }
        }
        Ok(report)
    }

    async fn fire_one(
        &self,
        stored: &StoredSchedule,
        now: i64,
        report: &mut FireReport,
    ) -> Result<()> {
        let schedule = ScheduleSpec::from_json(&stored.spec)?.to_schedule()?;
        let p = plan(
            &schedule.cadence,
            &schedule.catch_up,
            stored.fired_through,
            now,
        );
        if let Some(next) = schedule.cadence.next_after(p.through) {
            report.next = Some(report.next.map_or(next, |n: i64| n.min(next)));
        }
        if p.through == stored.fired_through {
            return Ok(());
        }
        // Slots another worker handled since are no longer this one's to send again.
        self.unsent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(name, slot), _| name != &stored.name || *slot > stored.fired_through);
        if let Some(task) = schedule.task()? {
            return self.maintain(stored, task, p).await;
        }
        if !p.fire.is_empty() {
            let derived = self.transport.capabilities().idempotent_publish;
            let jobs = {
                let unsent = self.unsent.lock().unwrap_or_else(|e| e.into_inner());
                p.fire
                    .iter()
                    .map(|slot| match unsent.get(&(stored.name.clone(), *slot)) {
                        Some(job) => Ok(job.clone()),
                        None => schedule.slot_job(*slot, derived),
                    })
                    .collect::<Result<Vec<_>>>()?
            };
            let published = match self.transport.publish_batch(jobs.clone()).await {
                Ok(published) => {
                    let mut unsent = self.unsent.lock().unwrap_or_else(|e| e.into_inner());
                    for slot in &p.fire {
                        unsent.remove(&(stored.name.clone(), *slot));
                    }
                    published
                }
                Err(e) => {
                    let mut unsent = self.unsent.lock().unwrap_or_else(|e| e.into_inner());
                    for (slot, job) in p.fire.iter().zip(jobs) {
                        unsent.insert((stored.name.clone(), *slot), job);
                    }
                    return Err(e);
                }
            };
            let duplicates = published.duplicates.len() as u64;
            report.duplicates += duplicates;
            report.stored += p.fire.len() as u64 - duplicates.min(p.fire.len() as u64);
        }
        // Only the worker that moves the cursor counts the slots: each is counted once.
        if self
            .store
            .advance(&stored.name, stored.fired_through, p.through)
            .await?
        {
            report.missed += p.missed;
            crate::metrics::schedule_slots(
                self.tenant.as_deref(),
                &stored.name,
                p.fire.len() as u64,
                p.missed,
            );
            if p.missed > 0 {
                tracing::warn!(schedule = %stored.name, missed = p.missed, fired = p.fire.len(), "slots passed while no worker could fire them");
            } else {
                tracing::debug!(schedule = %stored.name, fired = p.fire.len(), "schedule fired");
            }
        }
        Ok(())
    }

    /// A slot of built-in maintenance: run in process by the one worker that moves the
    /// cursor (in a task of its own, so a long prune holds up no other schedule). A
    /// worker that dies mid-run leaves the work to the next slot: each run is whole.
    async fn maintain(&self, stored: &StoredSchedule, task: Task, p: Plan) -> Result<()> {
        if !self
            .store
            .advance(&stored.name, stored.fired_through, p.through)
            .await?
        {
            return Ok(());
        }
        crate::metrics::schedule_slots(
            self.tenant.as_deref(),
            &stored.name,
            p.fire.len() as u64,
            p.missed,
        );
        if p.fire.is_empty() {
            return Ok(());
        }
        let (transport, status, name) = (
            self.transport.clone(),
            self.status.clone(),
            stored.name.clone(),
        );
        tokio::spawn(async move {
            match task.run(&transport, status.as_ref()).await {
                Ok(done) => tracing::info!(schedule = %name, "{done}"),
                Err(e) => {
                    tracing::warn!(schedule = %name, error = %e, "maintenance failed; it runs again at the next slot")
                }
            }
        });
        Ok(())
    }

    /// Pauses or resumes schedule `name` (see [`ScheduleStore::set_paused`]); whether
    /// that changed it.
    pub async fn set_paused(&self, name: &str, paused: bool, now: i64) -> Result<bool> {
        self.store.set_paused(name, paused, now).await
    }

    /// Deletes schedule `name`; whether there was one.
    pub async fn remove(&self, name: &str) -> Result<bool> {
        self.store.remove(name).await
    }

    /// Publishes a job of schedule `name` now, outside its slots; its id.
    pub async fn trigger(&self, name: &str) -> Result<Uuid> {
        let stored = self
            .store
            .list()
            .await?
            .into_iter()
            .find(|s| s.name == name)
            .ok_or_else(|| Error::InvalidInput(format!("no schedule is named {name:?}")))?;
        let job = ScheduleSpec::from_json(&stored.spec)?
            .to_schedule()?
            .triggered_job()?;
        let id = job.id;
        self.transport.publish_batch(vec![job]).await?;
        Ok(id)
    }

    /// Every schedule, with its next run as of `now` (µs).
    pub async fn list(&self, now: i64) -> Result<Vec<ScheduleInfo>> {
        list_schedules(self.store.as_ref(), now).await
    }

    /// Fires due slots until `shutdown`, looking again at the next slot or within a
    /// second.
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            // The time first: a round that starts after the stop fires nothing later.
            let now = now_us();
            if shutdown.is_cancelled() {
                return;
            }
            let wait = match self.fire_due(now).await {
                Ok(report) => report.next.map_or(LOOK_EVERY, |next| {
                    let until = next.saturating_sub(now_us()).max(0);
                    Duration::from_micros(until.unsigned_abs()).min(LOOK_EVERY)
                }),
                Err(e) => {
                    tracing::warn!(error = %e, "reading the schedules failed; trying again");
                    STORE_DOWN_WAIT
                }
            };
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

/// Every schedule of `store`, with its next run as of `now` (µs).
pub async fn list_schedules(store: &dyn ScheduleStore, now: i64) -> Result<Vec<ScheduleInfo>> {
    Ok(store
        .list()
        .await?
        .into_iter()
        .map(|stored| info(stored, now))
        .collect())
}

fn info(stored: StoredSchedule, now: i64) -> ScheduleInfo {
    let when = |us: i64| DateTime::<Utc>::from_timestamp_micros(us);
    let spec = ScheduleSpec::from_json(&stored.spec);
    let (spec, next_run, error) = match spec.and_then(|s| s.to_schedule().map(|c| (s, c))) {
        Ok((spec, schedule)) => {
            let next = (!stored.paused)
                .then(|| schedule.cadence.next_after(stored.fired_through.max(now)))
                .flatten()
                .and_then(when);
            (spec, next, None)
        }
        Err(e) => (
            ScheduleSpec::from_json(&stored.spec).unwrap_or_else(|_| ScheduleSpec {
                name: stored.name.clone(),
                cron: None,
                every: None,
                timezone: None,
                queue: String::new(),
                kind: String::new(),
                payload: None,
                catch_up: None,
                max_runs: None,
                within: None,
            }),
            None,
            Some(e.to_string()),
        ),
    };
    ScheduleInfo {
        name: stored.name,
        spec,
        paused: stored.paused,
        fired_through: when(stored.fired_through),
        next_run,
        error,
    }
}
