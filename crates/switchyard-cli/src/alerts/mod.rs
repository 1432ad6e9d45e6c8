//! `serve --alert-webhook URL`: the built-in notifier for teams without Alertmanager.
//! Every `--alert-every` it reads the queues, the job status and the workers, and posts
//! each incident once when it opens and once when it resolves (the rules are in
//! `rules`; `docs/alerts.yml` holds the same rules for Prometheus).

mod incidents;
mod rules;
mod webhook;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use switchyard::{
    parse_duration, CancellationToken, ConfigError, Error, Result, StatusStore, Transport,
};

use crate::cli::ServeArgs;

pub(crate) use rules::Thresholds;

use incidents::{Incidents, Notice};
use rules::{Reading, Rules};
use webhook::Webhook;

/// The notifier's settings.
pub(crate) struct Alerting {
    webhook: Webhook,
    pub(crate) thresholds: Thresholds,
    pub(crate) every: Duration,
}

impl Alerting {
    /// The settings of `serve`'s flags; `None` without a webhook.
    pub(crate) fn from_args(args: &ServeArgs) -> Result<Option<Self>> {
        let Some(url) = args
            .alert_webhook
            .as_deref()
            .filter(|w| !w.trim().is_empty())
        else {
            return Ok(None);
        };
        let webhook = Webhook::new(url.trim())?;
        let every = parse_duration("--alert-every", &args.alert_every)?;
        let window = parse_duration("--alert-window", &args.alert_window)?;
        for (flag, d, text) in [
            ("--alert-every", every, &args.alert_every),
            ("--alert-window", window, &args.alert_window),
        ] {
            if d.is_zero() {
                return Err(ConfigError::new(
                    flag,
                    Some(text.clone()),
                    "a duration above zero, such as 15s or 5m",
                )
                .into());
            }
        }
        let failure_rate = off_or(&args.alert_failure_rate, |v| {
            v.parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r) && *r > 0.0)
                .ok_or_else(|| {
                    ConfigError::new(
                        "--alert-failure-rate",
                        Some(v.to_owned()),
                        "a share of failed jobs above 0 and at most 1, such as 0.2, or off",
                    )
                    .into()
                })
        })?;
        let dead_growth = off_or(&args.alert_dead_growth, |v| {
            v.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                ConfigError::new(
                    "--alert-dead-growth",
                    Some(v.to_owned()),
                    "a number of dead letters above 0, such as 10, or off",
                )
                .into()
            })
        })?;
        let oldest_ready = off_or(&args.alert_oldest_ready, |v| {
            Ok(parse_duration("--alert-oldest-ready", v)?)
        })?;
        let no_workers = off_or(&args.alert_no_workers, |v| {
            Ok(parse_duration("--alert-no-workers", v)?)
        })?;
        Ok(Some(Alerting {
            webhook,
            every,
            thresholds: Thresholds {
                failure_rate,
                min_finished: args.alert_min_finished,
                window,
                oldest_ready,
                dead_growth,
                no_workers,
            },
        }))
    }
}

/// `off` (or `none`) turns a rule off; anything else is its threshold.
fn off_or<T>(value: &str, parse: impl FnOnce(&str) -> Result<T>) -> Result<Option<T>> {
    if matches!(value.trim(), "off" | "none") {
        Ok(None)
    } else {
        parse(value.trim()).map(Some)
    }
}

/// Starts the notifier; it stops with `stop`.
pub(crate) fn spawn(
    alerting: Alerting,
    transport: Arc<dyn Transport>,
    store: Option<Arc<dyn StatusStore>>,
    stop: CancellationToken,
) {
    let Alerting {
        webhook,
        thresholds,
        every,
    } = alerting;
    if store.is_none() {
        tracing::warn!("no job status store: the failure-rate and no-workers alerts are off");
    }
    tracing::info!(webhook = webhook.host(), ?every, "alerting");
    let mut rules = Rules::new(thresholds.clone());
    let mut incidents = Incidents::default();
    let mut unsent: Vec<Notice> = Vec::new();
    let mut said_unlisted = false;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            match read(&transport, store.as_deref(), &thresholds).await {
                Ok(reading) => {
                    if !reading.queues_listed && !said_unlisted {
                        said_unlisted = true;
                        tracing::warn!("the backend cannot list its queues (RabbitMQ over AMQP): the oldest-ready, dead-letter and no-workers alerts are off");
                    }
                    unsent.extend(incidents.update(rules.evaluate(&reading)));
                }
                Err(err) => {
                    tracing::warn!(error = %err, "alerting could not read the queues; trying again")
                }
            }
            // In order; what fails is posted again at the next reading.
            while let Some(notice) = unsent.first() {
                match webhook.post(notice).await {
                    Ok(()) => {
                        tracing::info!(text = %webhook::text(notice), "alert posted");
                        unsent.remove(0);
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "posting an alert failed; trying again");
                        break;
                    }
                }
            }
        }
    });
}

async fn read(
    transport: &Arc<dyn Transport>,
    store: Option<&dyn StatusStore>,
    thresholds: &Thresholds,
) -> Result<Reading> {
    let at = Utc::now();
    let (queues, queues_listed) = match transport.stats(None).await {
        Ok(queues) => (queues, true),
        // RabbitMQ cannot list its queues over AMQP: the rules that read queues are off
        // there; the failure rate, from job status, still holds.
        Err(Error::NotSupported(_)) => (Vec::new(), false),
        Err(err) => return Err(err),
    };
    let (throughput, workers) = match store {
        Some(store) => {
            // Buckets a thirtieth of the window wide, at least a second.
            let bucket = (thresholds.window / 30).max(Duration::from_secs(1));
            (
                Some(store.throughput(thresholds.window, bucket).await?),
                Some(store.workers().await?),
            )
        }
        None => (None, None),
    };
    Ok(Reading {
        at,
        queues,
        queues_listed,
        throughput,
        workers,
    })
}
