//! `switchyard dead list|replay|purge`.

use switchyard::{parse_duration, Config, DeadSelection, Error, Result};

use crate::cli::DeadCommand;

pub(crate) async fn run(config: &Config, command: DeadCommand, json: bool) -> Result<()> {
    match command {
        DeadCommand::List {
            queue,
            limit,
            payload,
        } => list(config, queue, limit, payload, json).await,
        DeadCommand::Replay {
            id,
            all,
            queue,
            kind,
            older_than,
            dry_run,
        } => {
            let queue = super::common::queue_arg(queue.as_deref())?;
            let jobs = switchyard::connect_existing_jobs(config).await?;
            let filter = Filter::new(kind, older_than.as_deref())?;
            if filter.is_some() || dry_run {
                let ids = matching(jobs.transport().as_ref(), queue.as_ref(), id, &filter).await?;
                if dry_run {
                    return report(json, "would_replay", ids.len() as u64);
                }
                let mut n = 0;
                for id in ids {
                    n += jobs
                        .replay_dead(queue.as_ref(), &DeadSelection::Id(id))
                        .await?;
                }
                return report(json, "replayed", n);
            }
            let selection = selection(id, all, None)?;
            let n = jobs.replay_dead(queue.as_ref(), &selection).await?;
            report(json, "replayed", n)
        }
        DeadCommand::Purge {
            id,
            all,
            older_than,
            queue,
            kind,
            dry_run,
        } => {
            let queue = super::common::queue_arg(queue.as_deref())?;
            let t = switchyard::connect_existing(config).await?;
            if kind.is_some() || dry_run {
                let filter = Filter::new(kind, older_than.as_deref())?;
                let ids = matching(t.as_ref(), queue.as_ref(), id, &filter).await?;
                if dry_run {
                    return report(json, "would_purge", ids.len() as u64);
                }
                let mut n = 0;
                for id in ids {
                    n += t.dead_purge(queue.as_ref(), &DeadSelection::Id(id)).await?;
                }
                return report(json, "purged", n);
            }
            let selection = selection(id, all, older_than)?;
            let n = t.dead_purge(queue.as_ref(), &selection).await?;
            report(json, "purged", n)
        }
    }
}

/// `dead list`: the dead letters, as lines or one JSON array.
async fn list(
    config: &Config,
    queue: Option<String>,
    limit: usize,
    payload: bool,
    json: bool,
) -> Result<()> {
    let queue = super::common::queue_arg(queue.as_deref())?;
    let t = switchyard::connect_existing(config).await?;
    let dead = t.dead_list(queue.as_ref(), limit).await?;
    if let (Some(q), switchyard::BackendKind::RabbitMq, true) =
        (&queue, config.backend, dead.is_empty())
    {
        if t.stats(Some(q)).await?.is_empty() {
            return Err(super::common::missing_broker_queue(q));
        }
    }
    if json {
        let mut rows: Vec<serde_json::Value> = if payload {
            dead.iter().map(crate::payload::with_payload).collect()
        } else {
            dead.iter()
                .map(|d| serde_json::to_value(d).unwrap_or_default())
                .collect()
        };
        // Each row says whose it is when `--schema` names a tenant.
        if let Some(tenant) = &config.tenant {
            for row in rows.iter_mut().filter_map(serde_json::Value::as_object_mut) {
                row.insert("tenant".into(), tenant.as_str().into());
            }
        }
        return crate::output::json_line(&rows);
    }
    if dead.is_empty() {
        outln!("no dead letters");
    }
    for d in &dead {
        outln!(
            "{}  {}  {}  {}  attempts={}  dead_at={}",
            d.id,
            d.queue,
            if d.kind.is_empty() { "-" } else { &d.kind },
            d.reason,
            d.attempts,
            d.dead_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
        if let Some(e) = &d.last_error {
            outln!("    last error: {}", e.lines().next().unwrap_or_default());
        }
        if let Some(key) = &d.ordering_key {
            outln!("    broke the sequence of ordering key {key:?}: the key's later messages went on without it");
        }
        if payload {
            outln!(
                "    payload: {}",
                indent(&crate::payload::payload_text(d), "      ")
            );
        }
    }
    Ok(())
}

/// The dead letters a bulk replay or purge by kind or age acts on, read from the list.
#[derive(Debug, Default)]
struct Filter {
    kind: Option<String>,
    older_than: Option<std::time::Duration>,
}

impl Filter {
    /// `None` when neither a kind nor an age is given.
    fn new(kind: Option<String>, older_than: Option<&str>) -> Result<Option<Self>> {
        let older_than = older_than
            .map(|d| parse_duration("--older-than", d))
            .transpose()?;
        Ok((kind.is_some() || older_than.is_some()).then_some(Filter { kind, older_than }))
    }
}

/// The most dead letters a bulk action by filter reads.
const MOST_FILTERED: usize = 100_000;

/// The ids of the dead letters of `queue` that `filter` (or `id` alone) selects.
async fn matching(
    t: &dyn switchyard::Transport,
    queue: Option<&switchyard::QueueName>,
    id: Option<String>,
    filter: &Option<Filter>,
) -> Result<Vec<String>> {
    let now = chrono::Utc::now();
    let letters = t.dead_list(queue, MOST_FILTERED).await?;
    Ok(letters
        .into_iter()
        .filter(|d| id.as_ref().is_none_or(|id| d.id == *id))
        .filter(|d| {
            filter.as_ref().is_none_or(|f| {
                f.kind.as_ref().is_none_or(|k| *k == d.kind)
                    && f.older_than
                        .is_none_or(|age| (now - d.dead_at).to_std().unwrap_or_default() >= age)
            })
        })
        .map(|d| d.id)
        .collect())
}

fn selection(id: Option<String>, all: bool, older_than: Option<String>) -> Result<DeadSelection> {
    match (id, all, older_than) {
        (Some(id), false, None) => Ok(DeadSelection::Id(id)),
        (None, true, None) => Ok(DeadSelection::All),
        (None, false, Some(age)) => Ok(DeadSelection::OlderThan(parse_duration(
            "--older-than",
            &age,
        )?)),
        _ => Err(Error::InvalidInput(
            "choose exactly one of --id ID, --all or --older-than DUR".into(),
        )),
    }
}

fn report(json: bool, verb: &str, n: u64) -> Result<()> {
    if json {
        crate::output::json_line(&serde_json::json!({ verb: n }))
    } else {
        outln!("{verb} {n} dead letter{}", if n == 1 { "" } else { "s" });
        Ok(())
    }
}

fn indent(text: &str, by: &str) -> String {
    text.lines().collect::<Vec<_>>().join(&format!("\n{by}"))
}
