//! `switchyard dead list|replay|purge`.

use switchyard::{parse_duration, Config, DeadSelection, Error, Result};

use crate::cli::DeadCommand;

pub(crate) async fn run(config: &Config, command: DeadCommand, json: bool) -> Result<()> {
    match command {
        DeadCommand::List {
            queue,
            limit,
            payload,
        } => {
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
        DeadCommand::Replay { id, all, queue } => {
            let selection = selection(id, all, None)?;
            let queue = super::common::queue_arg(queue.as_deref())?;
            let jobs = switchyard::connect_existing_jobs(config).await?;
            let n = jobs.replay_dead(queue.as_ref(), &selection).await?;
            report(json, "replayed", n)
        }
        DeadCommand::Purge {
            id,
            all,
            older_than,
            queue,
        } => {
            let selection = selection(id, all, older_than)?;
            let queue = super::common::queue_arg(queue.as_deref())?;
            let t = switchyard::connect_existing(config).await?;
            let n = t.dead_purge(queue.as_ref(), &selection).await?;
            report(json, "purged", n)
        }
    }
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
