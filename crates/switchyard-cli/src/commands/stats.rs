//! `switchyard stats`.

use switchyard::{BackendKind, Config, HeldSelection, QueueName, QueueStats, Result};

use crate::cli::StatsArgs;
use crate::output::human_duration;

pub(crate) async fn run(config: &Config, args: StatsArgs, json: bool) -> Result<()> {
    let queue = super::common::queue_arg(args.queue.as_deref())?;
    if args.held {
        return held(config, queue.as_ref(), args.limit, json).await;
    }
    if args.limits {
        return limits(config, queue.as_ref(), json).await;
    }
    if config.migrating() {
        return migration(config, queue.as_ref(), json).await;
    }
    let jobs = switchyard::connect_existing_jobs(config).await?;
    let transport = jobs.transport().clone();
    let stats = transport.stats(queue.as_ref()).await?;
    // What operators paused, where the store beside the jobs keeps it.
    let paused = match jobs.store().and_then(|s| s.controls()) {
        Some(controls) => controls
            .paused()
            .await?
            .into_iter()
            .filter(|p| queue.as_ref().is_none_or(|q| q.as_str() == p.queue))
            .collect(),
        None => Vec::new(),
    };
    // On RabbitMQ the transport returns a row for every queue that exists (zeros
    // included): no row for a queue named explicitly means the broker has none.
    if let (Some(q), BackendKind::RabbitMq, true) = (&queue, config.backend, stats.is_empty()) {
        return Err(super::common::missing_broker_queue(q));
    }
    // RabbitMQ keeps delayed messages in a chain shared by every queue: only the
    // process that delayed them counts them, and this one delayed none.
    let delayed_counted = transport.capabilities().delayed_stats;
    if json {
        let mut line = serde_json::json!({
            "backend": transport.name(),
            "delayed_counted": delayed_counted,
            "queues": stats,
            "paused": paused,
        });
        if let (Some(tenant), Some(obj)) = (&config.tenant, line.as_object_mut()) {
            obj.insert("tenant".into(), tenant.as_str().into());
        }
        return crate::output::json_line(&line);
    }
    for p in &paused {
        match &p.kind {
            Some(kind) => outln!("paused: kind {kind} of queue {}", p.queue),
            None => outln!("paused: queue {}", p.queue),
        }
    }
    if stats.is_empty() {
        outln!(
            "no messages on {} ({})",
            transport.name(),
            super::common::store_url(config)
        );
        return Ok(());
    }
    outln!(
        "{:<32} {:>10} {:>10} {:>10} {:>10} {:>14}",
        "QUEUE",
        "READY",
        "DELAYED",
        "RESERVED",
        "DEAD",
        "OLDEST READY"
    );
    for s in stats {
        outln!(
            "{:<32} {:>10} {:>10} {:>10} {:>10} {:>14}",
            s.queue,
            s.ready,
            if delayed_counted {
                s.delayed.to_string()
            } else {
                "-".into()
            },
            s.reserved,
            s.dead,
            s.oldest_ready_age
                .map(human_duration)
                .unwrap_or_else(|| "-".into())
        );
    }
    Ok(())
}

/// `stats --limits`: each key of a worker's limit, its slots held and its bucket.
async fn limits(config: &Config, queue: Option<&QueueName>, json: bool) -> Result<()> {
    let jobs = switchyard::connect_existing_jobs(config).await?;
    let Some(store) = jobs.store().and_then(|s| s.limits()) else {
        return Err(switchyard::Error::NotSupported(format!(
            "{} keeps no limits without a SQL store beside it (QUEUE_STATUS=on and a DATABASE_URL)",
            jobs.transport().name()
        )));
    };
    let usage: Vec<_> = store
        .usage()
        .await?
        .into_iter()
        .filter(|u| queue.is_none_or(|q| q.as_str() == u.queue))
        .collect();
    if json {
        return crate::output::json_line(&serde_json::json!({ "limits": usage }));
    }
    if usage.is_empty() {
        outln!("no limit has been used");
        return Ok(());
    }
    outln!(
        "{:<24} {:<40} {:>8} {:>12} {:>10} {:>10}",
        "QUEUE",
        "KEY",
        "RUNNING",
        "CONCURRENCY",
        "RATE/S",
        "TOKENS"
    );
    let shown = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    for u in usage {
        outln!(
            "{:<24} {:<40} {:>8} {:>12} {:>10} {:>10}",
            u.queue,
            u.key,
            u.running,
            shown(u.concurrency.map(|n| n.to_string())),
            shown(u.rate_per_second.map(|r| format!("{r:.2}"))),
            shown(u.tokens.map(|t| format!("{t:.1}")))
        );
    }
    Ok(())
}

/// `stats --held`: each held message, its holder and its lease's end.
async fn held(config: &Config, queue: Option<&QueueName>, limit: usize, json: bool) -> Result<()> {
    let transport = switchyard::connect_existing(config).await?;
    let held = transport
        .held(HeldSelection::Queue(queue), limit.max(1))
        .await?;
    if json {
        return crate::output::json_line(&serde_json::json!({
            "backend": transport.name(),
            "held": held,
        }));
    }
    if held.is_empty() {
        outln!("no message is held on {}", transport.name());
        return Ok(());
    }
    let now = chrono::Utc::now();
    outln!(
        "{:<36} {:<24} {:<20} {:<32} {:>8} {:>8}",
        "ID",
        "QUEUE",
        "KIND",
        "HELD BY",
        "FOR",
        "LEFT"
    );
    for h in held {
        let age = |t: chrono::DateTime<chrono::Utc>| {
            human_duration((now - t).to_std().unwrap_or_default())
        };
        outln!(
            "{:<36} {:<24} {:<20} {:<32} {:>8} {:>8}{}",
            h.id,
            h.queue,
            h.kind,
            h.holder.as_deref().unwrap_or("-"),
            h.claimed_at.map(age).unwrap_or_else(|| "-".into()),
            human_duration((h.lease_until - now).to_std().unwrap_or_default()),
            if h.started { "" } else { "  (claimed ahead)" }
        );
    }
    Ok(())
}

/// During a migration: each backend apart, with its role, and whether the one being left
/// is drained (nothing ready, delayed or reserved on it).
async fn migration(config: &Config, queue: Option<&QueueName>, json: bool) -> Result<()> {
    let mut sides = Vec::new();
    for kind in [config.backend, config.backend.other()] {
        // A canary share goes to the other backend whichever way the canary points, and
        // workers consume it there as well: it is being fed, not left, so never
        // "draining" (nor "drained") while the share is above 0, even though its URL
        // being set would otherwise mark it as the backend to drain.
        let role = if kind == config.backend {
            "primary".to_owned()
        } else if config.canary_percent > 0 {
            format!("canary {}%", config.canary_percent)
        } else {
            "draining".to_owned()
        };
        let stats: std::result::Result<Vec<QueueStats>, String> =
            match switchyard::connect_backend(config, kind, false).await {
                Ok(t) => t.stats(queue).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
        let left = stats.as_ref().map_or(0, |s| {
            s.iter()
                .map(|q| q.ready + q.delayed + q.reserved)
                .sum::<u64>()
        });
        // RabbitMQ cannot count the delays another process published: it is never
        // called drained, only empty of ready and reserved messages.
        let drained = role == "draining" && stats.is_ok() && left == 0 && kind == BackendKind::Exec;
        sides.push((kind, role, drained, stats));
    }
    if json {
        let backends: Vec<serde_json::Value> = sides
            .iter()
            .map(|(kind, role, drained, stats)| {
                let mut v = serde_json::json!({
                    "backend": kind.to_string(),
                    "role": role,
                    "drained": drained,
                    "url": super::common::store_url_of(config, *kind),
                });
                match stats {
                    Ok(s) => v["queues"] = serde_json::json!(s),
                    Err(e) => v["error"] = serde_json::json!(e),
                }
                v
            })
            .collect();
        return crate::output::json_line(&serde_json::json!({
            "backend": "router",
            "backends": backends,
        }));
    }
    for (kind, role, drained, stats) in sides {
        let state = if drained { ", drained" } else { "" };
        if role == "draining" && kind == BackendKind::RabbitMq {
            outln!("  (RabbitMQ cannot count messages waiting in its delay chain: once nothing is ready or reserved, wait out the longest delay and retry backoff before switching it off)");
        }
        outln!(
            "{kind} ({role}{state}): {}",
            super::common::store_url_of(config, kind)
        );
        match stats {
            Ok(stats) if stats.is_empty() => outln!("  no messages"),
            Ok(stats) => {
                for s in stats {
                    let delayed = if kind == BackendKind::RabbitMq {
                        "-".to_owned()
                    } else {
                        s.delayed.to_string()
                    };
                    outln!(
                        "  {:<30} ready {:>8}  delayed {:>8}  reserved {:>8}  dead {:>8}",
                        s.queue,
                        s.ready,
                        delayed,
                        s.reserved,
                        s.dead
                    );
                }
            }
            Err(e) => outln!("  unavailable: {e}"),
        }
    }
    Ok(())
}
