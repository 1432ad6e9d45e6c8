//! `switchyard move --from exec|rabbitmq --to exec|rabbitmq --queue Q`: moves what is left
//! of a queue in one backend to the other, delayed messages and dead letters included,
//! keeping ids, attempts and due times, so that the old backend can be switched off
//! without waiting for the longest delay. Each batch is stored in the destination (and,
//! on RabbitMQ, confirmed) before it is removed from the source: a move that dies half
//! way leaves at worst a message in both, never in neither.

use std::collections::HashSet;

use switchyard::{
    BackendKind, Capabilities, ConfigError, DeadSelection, Error, QueueName, Result, Transport,
    TransportExt,
};

use super::forward::publish_forwarded;
use crate::cli::MoveArgs;

pub(crate) async fn run(config: &switchyard::Config, args: MoveArgs, json: bool) -> Result<()> {
    let from = backend("--from", &args.from)?;
    let to = backend("--to", &args.to)?;
    if from == to {
        return Err(ConfigError::new(
            "--to",
            Some(args.to.clone()),
            "the other backend than --from (exec or rabbitmq)",
        )
        .into());
    }
    let queue = QueueName::new(args.queue.clone())
        .map_err(|e| ConfigError::new("--queue", e.value, e.expected))?;
    let batch = args.batch.max(1);
    let source = switchyard::connect_backend(config, from, false).await?;
    let dest = switchyard::connect_backend(config, to, true).await?;
    let differences = differences(&source.capabilities(), &dest.capabilities(), to);
    if !json {
        for d in &differences {
            errln!("switchyard: warning: {d}");
        }
    }

    let now = chrono::Utc::now();
    let (mut moved, mut delayed, mut prioritised) = (0u64, 0u64, 0u64);
    loop {
        let taken = source.claim_for_move(&queue, batch).await?;
        if taken.is_empty() {
            break;
        }
        delayed += taken
            .iter()
            .filter(|r| r.envelope.available_at > now)
            .count() as u64;
        prioritised += taken.iter().filter(|r| r.envelope.priority != 0).count() as u64;
        // On failure the batch is not given back: its move leases return the rows at the
        // later of their due time and the lease's end, so no delay is cut short.
        publish_forwarded(
            dest.as_ref(),
            taken.iter().map(|r| r.envelope.clone()).collect(),
            "move",
        )
        .await?;
        let report = source.ack_batch(&taken).await?;
        if !report.lost.is_empty() {
            tracing::warn!(lost = report.lost.len(), "move: leases ran out before the removal; those messages may now be on both backends");
        }
        moved += taken.len() as u64;
    }

    let dead = move_dead(source.as_ref(), dest.as_ref(), &queue, batch).await?;
    // What no claim here could take: held by a worker, or by the lease of an earlier
    // move that failed between its copy and its removal. The source is not empty until
    // they are gone, which an operator about to stop draining it must know.
    let left: u64 = source
        .stats(Some(&queue))
        .await?
        .iter()
        .map(|s| s.ready + s.delayed + s.reserved)
        .sum();

    let mut notes = Vec::new();
    if left > 0 {
        notes.push(format!(
            "{left} messages of {queue} are still on {from}, held by a worker or by the lease of an earlier move that failed: keep draining {from}, or run this move again once their leases have run out"
        ));
    }
    if prioritised > 0 && !dest.capabilities().priorities {
        notes.push(format!(
            "{prioritised} moved messages carry a priority, which {to} does not order by"
        ));
    }
    if delayed > 0 && !dest.capabilities().exact_delays {
        notes.push(format!(
            "{delayed} moved messages are delayed: {to} rounds delays up to its delay levels (100 ms)"
        ));
    }
    if from == BackendKind::RabbitMq {
        notes.push(
            "messages waiting in RabbitMQ's delay chain cannot be taken out early: they reach the queue when due; keep draining RabbitMQ (QUEUE_DRAIN=rabbitmq) until the longest delay has passed".into(),
        );
    }
    if json {
        return crate::output::json_line(&serde_json::json!({
            "queue": queue.as_str(),
            "from": from.to_string(),
            "to": to.to_string(),
            "moved": moved,
            "delayed": delayed,
            "dead_letters": dead,
            "left": left,
            "differences": differences,
            "notes": notes,
        }));
    }
    outln!("moved {moved} messages ({delayed} delayed) and {dead} dead letters of {queue} from {from} to {to}");
    for n in notes {
        outln!("note: {n}");
    }
    Ok(())
}

fn backend(flag: &str, value: &str) -> Result<BackendKind> {
    match value {
        "exec" => Ok(BackendKind::Exec),
        "rabbitmq" => Ok(BackendKind::RabbitMq),
        _ => Err(ConfigError::new(flag, Some(value.to_owned()), "exec or rabbitmq").into()),
    }
}

/// What the destination promises less of than the source.
fn differences(source: &Capabilities, dest: &Capabilities, to: BackendKind) -> Vec<String> {
    let mut out = Vec::new();
    let mut lacks = |had: bool, has: bool, what: &str| {
        if had && !has {
            out.push(format!("{to} {what}"));
        }
    };
    lacks(
        source.priorities,
        dest.priorities,
        "does not order by priority",
    );
    lacks(
        source.exact_delays,
        dest.exact_delays,
        "rounds delays up to its delay levels",
    );
    lacks(
        source.exact_fifo,
        dest.exact_fifo,
        "does not keep publish order across redeliveries",
    );
    lacks(
        source.idempotent_publish,
        dest.idempotent_publish,
        "delivers an id published twice twice (no de-duplication)",
    );
    lacks(
        source.unique_keys,
        dest.unique_keys,
        "keeps no unique keys (moved messages go without theirs)",
    );
    lacks(
        source.delayed_stats,
        dest.delayed_stats,
        "cannot count another process's delayed messages in stats",
    );
    if dest.max_payload_bytes < source.max_payload_bytes {
        out.push(format!(
            "{to} takes envelopes of at most {} bytes, the source up to {}",
            dest.max_payload_bytes, source.max_payload_bytes
        ));
    }
    out
}

/// Moves the queue's dead letters, oldest first, each stored in the destination before
/// it is purged from the source; how many.
async fn move_dead(
    source: &dyn Transport,
    dest: &dyn Transport,
    queue: &QueueName,
    batch: usize,
) -> Result<u64> {
    let mut moved = 0u64;
    let mut seen: HashSet<String> = HashSet::new();
    // Letters without an id stay on the source and keep their place in its list, so
    // each listing asks for that many more: a batch of them must not end the move.
    let mut id_less = 0usize;
    loop {
        let limit = batch.saturating_add(id_less);
        let mut letters = source.dead_list(Some(queue), limit).await?;
        let listed = letters.len();
        // A letter without an id (a malformed message that carried none) cannot be
        // purged alone: it stays on the source, for `dead purge` or `dead replay` there.
        let without_id = letters.iter().filter(|l| l.id.is_empty()).count();
        letters.retain(|l| !l.id.is_empty());
        if letters.is_empty() {
            // A full list of them may hide letters with ids behind it.
            if listed == limit && without_id > id_less {
                id_less = without_id;
                continue;
            }
            if without_id > 0 {
                tracing::warn!(
                    count = without_id,
                    "move: dead letters without an id stay on the source"
                );
            }
            return Ok(moved);
        }
        if letters.iter().all(|l| seen.contains(&l.id)) {
            return Err(Error::InvalidInput(format!(
                "move: {} dead letters of {queue} could not be removed from the source after they were copied",
                letters.len()
            )));
        }
        id_less = without_id;
        dest.dead_insert(&letters).await?;
        for l in &letters {
            match source
                .dead_purge(Some(queue), &DeadSelection::Id(l.id.clone()))
                .await
            {
                Ok(_) | Err(Error::NotFound { .. }) => {}
                Err(err) => return Err(err),
            }
            seen.insert(l.id.clone());
        }
        moved += letters.len() as u64;
    }
}
