//! `switchyard schedule`: periodic jobs kept in the SQL store beside the jobs (RabbitMQ's
//! control store), fired by every running worker (see `switchyard::schedule`).

use std::collections::BTreeSet;

use serde::Deserialize;
use switchyard::schedule::{PutOutcome, ScheduleInfo, ScheduleSpec, Scheduler};
use switchyard::{Config, Error, Result};

use crate::cli::{ScheduleAddArgs, ScheduleCommand};

/// A schedules file: `[[schedule]]` tables.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleFile {
    #[serde(default)]
    schedule: Vec<ScheduleSpec>,
}

/// The scheduler of the store `config` names (its tables created first), or why there
/// is none.
async fn scheduler(config: &Config) -> Result<Scheduler> {
    let jobs = switchyard::connect_jobs(config).await?;
    let Some(store) = jobs.store().and_then(|s| s.schedules()) else {
        return Err(Error::NotSupported(format!(
            "{} keeps no schedules without a SQL store beside it: set DATABASE_URL (and QUEUE_STATUS=on)",
            jobs.transport().name()
        )));
    };
    Ok(Scheduler::new(store, jobs.transport().clone()))
}

pub(crate) async fn run(config: &Config, command: ScheduleCommand, json: bool) -> Result<()> {
    match command {
        ScheduleCommand::Apply(args) => {
            let text = std::fs::read_to_string(&args.file).map_err(|source| Error::Io {
                what: format!("reading {}", args.file.display()),
                source,
            })?;
            let file: ScheduleFile = toml::from_str(&text).map_err(|e| {
                Error::InvalidInput(format!(
                    "{}: {e}; accepted are [[schedule]] tables with the fields of `schedule add` (see `switchyard schedule --help`)",
                    args.file.display()
                ))
            })?;
            let schedules = file
                .schedule
                .iter()
                .map(ScheduleSpec::to_schedule)
                .collect::<Result<Vec<_>>>()
                .map_err(|e| Error::InvalidInput(format!("{}: {e}", args.file.display())))?;
            let scheduler = scheduler(config).await?;
            let outcomes = scheduler.apply(&schedules).await?;
            let mut removed = Vec::new();
            if args.prune {
                let named: BTreeSet<&str> = schedules.iter().map(|s| s.name.as_str()).collect();
                for info in scheduler.list(now_us()).await? {
                    if !named.contains(info.name.as_str()) && scheduler.remove(&info.name).await? {
                        removed.push(info.name);
                    }
                }
            }
            report_applied(&outcomes, &removed, json)
        }
        ScheduleCommand::Add(args) => {
            let schedule = spec_of(args)?.to_schedule()?;
            let outcomes = scheduler(config).await?.apply(&[schedule]).await?;
            report_applied(&outcomes, &[], json)
        }
        ScheduleCommand::Pause(args) => pause(config, &args.name, true, json).await,
        ScheduleCommand::Resume(args) => pause(config, &args.name, false, json).await,
        ScheduleCommand::Trigger(args) => {
            let id = scheduler(config).await?.trigger(&args.name).await?;
            if json {
                return crate::output::json_line(
                    &serde_json::json!({ "schedule": args.name, "id": id }),
                );
            }
            outln!("published job {id} of schedule {}", args.name);
            Ok(())
        }
        ScheduleCommand::Rm(args) => {
            let removed = scheduler(config).await?.remove(&args.name).await?;
            if !removed {
                return Err(Error::InvalidInput(format!(
                    "no schedule is named {:?}",
                    args.name
                )));
            }
            if json {
                return crate::output::json_line(&serde_json::json!({ "removed": args.name }));
            }
            outln!("removed schedule {} (its published jobs stay)", args.name);
            Ok(())
        }
        ScheduleCommand::List => {
            let list = scheduler(config).await?.list(now_us()).await?;
            if json {
                return crate::output::json_line(&serde_json::json!({ "schedules": list }));
            }
            print_list(&list);
            Ok(())
        }
    }
}

async fn pause(config: &Config, name: &str, paused: bool, json: bool) -> Result<()> {
    let scheduler = scheduler(config).await?;
    let changed = scheduler.set_paused(name, paused, now_us()).await?;
    if !changed
        && !scheduler
            .list(now_us())
            .await?
            .iter()
            .any(|i| i.name == name)
    {
        return Err(Error::InvalidInput(format!(
            "no schedule is named {name:?}"
        )));
    }
    if json {
        return crate::output::json_line(
            &serde_json::json!({ "schedule": name, "paused": paused, "changed": changed }),
        );
    }
    match (paused, changed) {
        (true, true) => outln!("paused schedule {name}: no worker fires it until it is resumed"),
        (false, true) => outln!(
            "resumed schedule {name}: it fires from its next slot (the slots while paused do not run)"
        ),
        (true, false) => outln!("schedule {name} was already paused"),
        (false, false) => outln!("schedule {name} was not paused"),
    }
    Ok(())
}

fn spec_of(args: ScheduleAddArgs) -> Result<ScheduleSpec> {
    let payload = match &args.payload {
        Some(text) => Some(serde_json::from_str(text).map_err(|e| {
            Error::InvalidInput(format!(
                "--payload {text:?}: {e}; accepted is one JSON value, such as '{{\"region\":\"eu\"}}'"
            ))
        })?),
        None => None,
    };
    Ok(ScheduleSpec {
        name: args.name,
        cron: args.cron,
        every: args.every,
        timezone: args.timezone,
        queue: args.queue,
        kind: args.kind,
        payload,
        catch_up: args.catch_up,
        max_runs: args.max_runs,
        within: args.within,
    })
}

fn report_applied(outcomes: &[(String, PutOutcome)], removed: &[String], json: bool) -> Result<()> {
    let word = |o: &PutOutcome| match o {
        PutOutcome::Added => "added",
        PutOutcome::Changed => "changed",
        PutOutcome::Unchanged => "unchanged",
    };
    if json {
        let applied: serde_json::Map<String, serde_json::Value> = outcomes
            .iter()
            .map(|(name, o)| (name.clone(), word(o).into()))
            .collect();
        return crate::output::json_line(
            &serde_json::json!({ "applied": applied, "removed": removed }),
        );
    }
    for (name, outcome) in outcomes {
        outln!("{name}: {}", word(outcome));
    }
    for name in removed {
        outln!("{name}: removed");
    }
    Ok(())
}

fn print_list(list: &[ScheduleInfo]) {
    if list.is_empty() {
        outln!("no schedules");
        return;
    }
    for info in list {
        let when = match (&info.spec.cron, &info.spec.every) {
            (Some(cron), _) => format!(
                "cron {cron:?} {}",
                info.spec.timezone.as_deref().unwrap_or("UTC")
            ),
            (None, Some(every)) => format!("every {every}"),
            _ => String::new(),
        };
        let next = match (&info.error, info.paused, info.next_run) {
            (Some(e), _, _) => format!("cannot fire: {e}"),
            (None, true, _) => "paused".to_owned(),
            (None, false, Some(at)) => format!("next {}", at.to_rfc3339()),
            (None, false, None) => "no next slot".to_owned(),
        };
        outln!(
            "{}  {when}  -> {} {}  catch-up {}  {next}",
            info.name,
            info.spec.queue,
            info.spec.kind,
            info.spec.catch_up.as_deref().unwrap_or("latest")
        );
    }
}

fn now_us() -> i64 {
    chrono::Utc::now().timestamp_micros()
}
