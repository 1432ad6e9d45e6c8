//! Cases of schedules, on a clock the case moves: racing schedulers fire each slot
//! once; missed slots follow the catch-up policy; a slot fired again after its job ran
//! (a worker that died before moving the cursor) stores nothing; schedules are stored,
//! paused, resumed, triggered and removed as documented; a worker's run that is dropped
//! stops firing them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::harness::{open_beside, Beside, Harness};
use super::worker_support::{fast, fresh_queue};
use crate::schedule::{
    Cadence, CatchUp, PutOutcome, Schedule, ScheduleSpec, ScheduleStore, Scheduler, SLOT_HEADER,
};
use crate::worker::{handler_fn, JobContext, Worker};
use crate::{Error, QueueName, Result, Transport, TransportExt};

const S: i64 = 1_000_000;

/// A fresh store's transport, status store and schedules, or `None` (said why) where
/// the backend keeps no schedules (RabbitMQ without a control store).
async fn open_scheduled(h: &Arc<dyn Harness>) -> Result<Option<Beside<dyn ScheduleStore>>> {
    open_beside(
        h,
        |s, _| s?.schedules(),
        "no store beside it keeps schedules",
    )
    .await
}

fn per_second(name: &str, q: &QueueName, catch_up: CatchUp) -> Schedule {
    let every = Cadence::every(Duration::from_secs(1)).expect("a valid interval");
    Schedule::new(name, every, q.as_str(), "tick").catch_up(catch_up)
}

/// A whole second two minutes ago: the cases' clock starts there.
fn start() -> i64 {
    (chrono::Utc::now().timestamp() - 120) * S
}

/// Stores `schedule` as if added at `at`.
async fn put_at(store: &Arc<dyn ScheduleStore>, schedule: &Schedule, at: i64) -> Result<()> {
    let outcome = store
        .put(&schedule.name, &ScheduleSpec::of(schedule).to_json(), at)
        .await?;
    assert_eq!(outcome, PutOutcome::Added);
    Ok(())
}

/// Claims and acks every job of `q`: how many each slot header had.
async fn take_all(t: &dyn Transport, q: &QueueName) -> Result<BTreeMap<String, u32>> {
    let mut slots = BTreeMap::new();
    loop {
        let got = t.reserve_batch(q, 100).await?;
        if got.is_empty() {
            return Ok(slots);
        }
        for r in &got {
            let slot = r
                .envelope
                .headers
                .get(SLOT_HEADER)
                .cloned()
                .unwrap_or_default();
            *slots.entry(slot).or_insert(0) += 1;
        }
        t.ack_batch(&got).await?;
    }
}

/// Four schedulers firing one per-second schedule at interleaved moments of a
/// simulated minute, each missing some looks, store exactly one job per slot.
pub async fn racing_schedulers_fire_each_slot_once(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t, _status, store)) = open_scheduled(&h).await? else {
        return Ok(());
    };
    let q = fresh_queue();
    let all = CatchUp::All {
        max_runs: 100,
        within: Duration::from_secs(3600),
    };
    let schedule = per_second(&format!("race-{q}"), &q, all);
    let t0 = start();
    put_at(&store, &schedule, t0).await?;
    let tasks: Vec<_> = (0..4)
        .map(|n| {
            let scheduler = Scheduler::new(store.clone(), t.clone());
            tokio::spawn(async move {
                let mut rng = fastrand::Rng::with_seed(n);
                for k in 1..=60 {
                    // Each scheduler misses about a third of its looks.
                    if rng.u8(..3) == 0 {
                        continue;
                    }
                    scheduler.fire_due(t0 + k * S + S / 2).await?;
                    tokio::task::yield_now().await;
                }
                Ok::<_, Error>(())
            })
        })
        .collect();
    for task in tasks {
        task.await
            .map_err(|e| Error::InvalidInput(format!("a scheduler task failed: {e}")))??;
    }
    Scheduler::new(store.clone(), t.clone())
        .fire_due(t0 + 60 * S + S / 2)
        .await?;
    let slots = take_all(t.as_ref(), &q).await?;
    assert_eq!(slots.len(), 60, "one job per slot: {slots:?}");
    assert!(
        slots.values().all(|n| *n == 1),
        "a slot ran twice: {slots:?}"
    );
    let stored = store.list().await?;
    let row = stored
        .iter()
        .find(|s| s.name == schedule.name)
        .expect("the schedule");
    assert_eq!(
        row.fired_through,
        t0 + 60 * S,
        "the cursor is at the last slot"
    );
    Ok(())
}

/// After ten slots passed unfired, `skip` and `latest` fire one (the latest is on time
/// for a per-second schedule), `all` fires at most `max_runs`; and a slot fired again
/// after its job ran stores nothing.
pub async fn missed_slots_follow_the_catch_up_policy(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t, _status, store)) = open_scheduled(&h).await? else {
        return Ok(());
    };
    let t0 = start();
    let mut queues = Vec::new();
    for (catch_up, expected) in [
        (CatchUp::Skip, 1),
        (CatchUp::Latest, 1),
        (
            CatchUp::All {
                max_runs: 3,
                within: Duration::from_secs(3600),
            },
            3,
        ),
    ] {
        let q = fresh_queue();
        let schedule = per_second(&format!("missed-{q}"), &q, catch_up);
        put_at(&store, &schedule, t0).await?;
        queues.push((q, schedule, expected));
    }
    let scheduler = Scheduler::new(store.clone(), t.clone());
    let report = scheduler.fire_due(t0 + 10 * S + S / 2).await?;
    assert_eq!(report.missed, 9 + 9 + 7, "{report:?}");
    for (q, schedule, expected) in &queues {
        let slots = take_all(t.as_ref(), q).await?;
        assert_eq!(
            slots.values().sum::<u32>(),
            *expected,
            "{:?}: {slots:?}",
            schedule.catch_up
        );
    }
    // A worker that published slot 10 and died before moving the cursor: the next
    // fires it again, after its job already ran.
    let (q, schedule, _) = &queues[1];
    assert!(
        store
            .advance(&schedule.name, t0 + 10 * S, t0 + 9 * S)
            .await?
    );
    let again = scheduler.fire_due(t0 + 10 * S + S / 2).await?;
    assert_eq!((again.stored, again.duplicates), (0, 1), "{again:?}");
    assert!(take_all(t.as_ref(), q).await?.is_empty());
    Ok(())
}

/// Applying the same schedules twice changes nothing; a changed definition keeps its
/// cursor; a paused schedule fires nothing and resumes without catching up; a trigger
/// publishes a job of its own; a removed schedule is gone.
pub async fn schedules_are_applied_paused_triggered_and_removed(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t, _status, store)) = open_scheduled(&h).await? else {
        return Ok(());
    };
    let q = fresh_queue();
    let scheduler = Scheduler::new(store.clone(), t.clone());
    let name = format!("apply-{q}");
    let schedule = per_second(&name, &q, CatchUp::Latest);
    let first = scheduler.apply(std::slice::from_ref(&schedule)).await?;
    assert_eq!(first, [(name.clone(), PutOutcome::Added)]);
    let cursor = |list: Vec<crate::schedule::StoredSchedule>| {
        list.into_iter()
            .find(|s| s.name == name)
            .map(|s| (s.fired_through, s.paused))
    };
    let before = cursor(store.list().await?).expect("stored");
    let second = scheduler.apply(std::slice::from_ref(&schedule)).await?;
    assert_eq!(second, [(name.clone(), PutOutcome::Unchanged)]);
    let third = scheduler.apply(&[changed_schedule(&schedule)]).await?;
    assert_eq!(third, [(name.clone(), PutOutcome::Changed)]);
    assert_eq!(
        cursor(store.list().await?),
        Some(before),
        "the cursor and pause kept"
    );
    // A new cadence starts from now: the old one's slots are not caught up.
    let mut slower = changed_schedule(&schedule);
    slower.cadence = Cadence::every(Duration::from_secs(2)).expect("a valid interval");
    let asked = chrono::Utc::now().timestamp_micros();
    let fourth = scheduler.apply(std::slice::from_ref(&slower)).await?;
    assert_eq!(fourth, [(name.clone(), PutOutcome::Changed)]);
    let (moved, _) = cursor(store.list().await?).expect("stored");
    assert!(
        moved >= asked,
        "the cursor of a new cadence starts from now"
    );
    let twice = scheduler.apply(&[schedule.clone(), schedule.clone()]).await;
    assert!(matches!(twice, Err(Error::InvalidInput(m)) if m.contains("defined twice")));

    let now = chrono::Utc::now().timestamp() * S;
    assert!(store.set_paused(&name, true, now).await?);
    assert!(!store.set_paused(&name, true, now).await?, "paused once");
    let report = scheduler.fire_due(now + 30 * S).await?;
    assert_eq!(report.stored, 0, "a paused schedule fires nothing");
    assert!(store.set_paused(&name, false, now + 30 * S).await?);
    assert_eq!(
        cursor(store.list().await?),
        Some((now + 30 * S, false)),
        "resumed from now"
    );
    let report = scheduler.fire_due(now + 30 * S + S / 2).await?;
    assert_eq!((report.stored, report.missed), (0, 0), "{report:?}");

    let id = scheduler.trigger(&name).await?;
    let jobs = t.reserve_batch(&q, 10).await?;
    assert_eq!(jobs.iter().map(|r| r.envelope.id).collect::<Vec<_>>(), [id]);
    assert_eq!(jobs[0].envelope.payload.get(), r#"{"report":"weekly"}"#);
    t.ack_batch(&jobs).await?;
    assert!(matches!(
        scheduler.trigger("no-such").await,
        Err(Error::InvalidInput(_))
    ));

    let listed = scheduler.list(now).await?;
    let info = listed.iter().find(|i| i.name == name).expect("listed");
    assert!(info.next_run.is_some() && info.error.is_none(), "{info:?}");
    assert!(store.remove(&name).await?);
    assert!(!store.remove(&name).await?);
    assert!(cursor(store.list().await?).is_none());
    Ok(())
}

/// A worker's run whose future is dropped (a timeout around it, a `select!` that took
/// another branch) stops everything it started: its schedule fires while it runs and
/// never after.
pub async fn a_dropped_worker_run_fires_no_more_slots(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t, status, _schedules)) = open_scheduled(&h).await? else {
        return Ok(());
    };
    let (q, ticks) = (fresh_queue(), fresh_queue());
    let schedule = per_second(&format!("dropped-{ticks}"), &ticks, CatchUp::Latest);
    let options = fast().with_drain(false).with_schedules([schedule]);
    let worker = Worker::new(t.clone(), q, options)
        .with_status(status)
        .handle("job", handler_fn(|_ctx: JobContext| async { Ok(()) }));
    // Never cancelled: only the drop ends the run.
    let stop = CancellationToken::new();
    let ran = tokio::time::timeout(Duration::from_millis(2_500), worker.run(stop.clone())).await;
    let dropped = chrono::Utc::now();
    assert!(ran.is_err(), "the run ended by itself: {ran:?}");
    // Slots due after the drop would have fired in this time. (A slot being stored as
    // the run was dropped may still land: its time is before the drop.)
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let slots = take_all(t.as_ref(), &ticks).await?;
    let at = |slot: &String| {
        chrono::DateTime::parse_from_rfc3339(slot)
            .map_err(|e| Error::InvalidInput(format!("slot {slot}: {e}")))
    };
    for slot in slots.keys() {
        assert!(
            at(slot)? <= dropped,
            "slot {slot} fired after the run was dropped at {dropped}"
        );
    }
    assert!(
        !slots.is_empty(),
        "the schedule never fired while the worker ran"
    );
    assert!(!stop.is_cancelled(), "the caller's token is the caller's");
    Ok(())
}

/// The built-in pruning schedule publishes no job: at a slot, the one scheduler that
/// moves its cursor deletes the dead letters (and finished records) older than its
/// setting; a reserved kind it does not know is refused.
pub async fn a_pruning_schedule_prunes_at_its_slot_and_publishes_nothing(
    h: Arc<dyn Harness>,
) -> Result<()> {
    let Some((_store, t, status, store)) = open_scheduled(&h).await? else {
        return Ok(());
    };
    let q = fresh_queue();
    t.publish(
        crate::Envelope::builder(q.as_str(), "doomed")
            .build()
            .expect("a valid envelope"),
    )
    .await?;
    let r = t.reserve(&q).await?.expect("the job");
    t.dead_letter(&r, crate::reason::FAILED, Some("on purpose"))
        .await?;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let every = Cadence::every(Duration::from_secs(1)).expect("a valid interval");
    let prune = Schedule::prune(Duration::from_millis(10), every.clone());
    let t0 = start();
    put_at(&store, &prune, t0).await?;
    let schedulers: Vec<_> = (0..3)
        .map(|_| Scheduler::new(store.clone(), t.clone()).with_status(Some(status.clone())))
        .collect();
    for scheduler in &schedulers {
        let report = scheduler.fire_due(t0 + 5 * S + S / 2).await?;
        assert_eq!((report.stored, report.duplicates), (0, 0), "{report:?}");
    }
    // The prune runs in a task of its own; a dead-letter listing beside it would hold
    // RabbitMQ's dead letters from its purge, so the case looks only once it is done.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        t.dead_list(Some(&q), 10).await?.is_empty(),
        "the pruning schedule did not prune"
    );
    let name = crate::schedule::PRUNE;
    let maintenance = QueueName::new("switchyard").expect("a queue name");
    assert!(
        t.reserve_batch(&maintenance, 10).await?.is_empty(),
        "it published a job"
    );
    let vacuum = Schedule::new("vacuum", every, q.as_str(), "switchyard.vacuum");
    let refused = Scheduler::new(store.clone(), t.clone())
        .apply(&[vacuum])
        .await;
    assert!(matches!(refused, Err(Error::InvalidInput(m)) if m.contains(name)));
    Ok(())
}

/// `schedule` with another payload.
fn changed_schedule(schedule: &Schedule) -> Schedule {
    schedule
        .clone()
        .payload(serde_json::json!({"report": "weekly"}))
}
