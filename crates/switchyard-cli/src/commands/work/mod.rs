//! `switchyard work --exec CMD`: runs a command once per message, in any language.

mod command_check;
mod control_socket;
mod exec_handler;
mod tenants;

use std::sync::Arc;
use std::time::Duration;

use switchyard::worker::{RetryPolicy, WorkerOptions, WorkerReport};
use switchyard::{parse_duration, CancellationToken, Config, QueueName, Result};

use crate::cli::WorkArgs;

pub(crate) async fn run(config: &Config, args: WorkArgs, json: bool) -> Result<()> {
    let queue = QueueName::new(args.queue.clone())
        .map_err(|e| switchyard::ConfigError::new("--queue", e.value, e.expected))?;
    command_check::check(&args.exec)?;
    let options = worker_options(&args)?;
    let prune_older_than = args
        .prune_older_than
        .as_deref()
        .map(|d| parse_duration("--prune-older-than", d))
        .transpose()?;
    let metrics = args
        .metrics_listen
        .as_deref()
        .map(|addr| crate::listen::parse_listen("--metrics-listen", addr))
        .transpose()?;
    let (shutdown, abort) = (CancellationToken::new(), CancellationToken::new());
    crate::signals::spawn_signal_handler(shutdown.clone(), abort.clone())?;
    let sources = crate::metrics_listener::Sources::default();
    if let Some(addr) = metrics {
        crate::metrics_listener::spawn(addr, sources.clone(), shutdown.clone()).await?;
    }
    let amqp_used = config.backend == switchyard::BackendKind::RabbitMq
        || config.drain_from() == Some(switchyard::BackendKind::RabbitMq)
        || config.canary_percent > 0;
    if let (Some(tenant), true) = (&config.tenant, amqp_used) {
        if !switchyard::tenants::is_template(config.amqp_url.expose()) {
            // Its status is the tenant's own, but its messages are the vhost's: a worker
            // of another tenant on the same vhost would take them.
            tracing::warn!(%tenant, "QUEUE_SCHEMA names a tenant but AMQP_URL has no {{tenant}}: its RabbitMQ messages share the URL's vhost with any other tenant using it");
        }
    }
    let rescan_every = parse_duration("--tenant-rescan", &args.tenant_rescan)?;
    if rescan_every < Duration::from_millis(100) {
        return Err(switchyard::ConfigError::new(
            "--tenant-rescan",
            Some(args.tenant_rescan.clone()),
            "a duration of at least 100ms, such as 30s or 5m",
        )
        .into());
    }
    let serving = Serving {
        several: config.tenants.is_some(),
        rescan_every,
        queue,
        options,
        command: args.exec.clone(),
        stderr_log: !args.no_stderr_log,
        prune_older_than,
        // Without it a command's `switchyard progress` fails and the job goes on.
        control: control_socket::ControlSocket::start(abort.clone())
            .map_err(|e| tracing::warn!(error = %e, "no control socket: `switchyard progress` will fail"))
            .ok(),
        sources,
        shutdown: shutdown.clone(),
        abort,
    };
    let mut running = tenants::Running::default();
    for tenant in switchyard::tenants::tenant_configs(config).await? {
        if shutdown.is_cancelled() {
            break;
        }
        if let Err(err) = running.start(&serving, &tenant).await {
            // The tenants started so far stop as at shutdown: their work released,
            // their workers deregistered.
            shutdown.cancel();
            let _ = running.finish().await;
            return Err(err);
        }
    }
    // A pattern finds tenants added later too, unless the run ends when drained.
    let patterns = config
        .tenants
        .as_ref()
        .is_some_and(|t| !t.patterns.is_empty());
    if patterns && !args.drain {
        running.rescan(&serving, config).await;
    }
    let reports = running.finish().await?;
    print_reports(reports, config.tenants.is_some(), json)
}

/// The worker's options from the command line, each bad value named.
fn worker_options(args: &WorkArgs) -> Result<WorkerOptions> {
    let timeout = args
        .timeout
        .as_deref()
        .map(|t| parse_duration("--timeout", t))
        .transpose()?;
    if timeout.is_some_and(|t| t.is_zero()) {
        return Err(switchyard::ConfigError::new(
            "--timeout",
            args.timeout.clone(),
            "a duration above zero, such as 30s or 10m (leave it out for no timeout)",
        )
        .into());
    }
    let retry = RetryPolicy::new(
        parse_duration("--backoff-base", &args.backoff_base)?,
        parse_duration("--backoff-max", &args.backoff_max)?,
        args.max_attempts,
    );
    let options = WorkerOptions::default()
        .with_concurrency(usize::from(args.concurrency))
        .with_retry(retry)
        .with_timeout(timeout)
        .with_grace_period(parse_duration("--grace", &args.grace)?)
        .with_drain(args.drain)
        .with_labels(labels_arg(&args.labels)?)
        .with_limits(
            args.limits
                .iter()
                .map(|spec| switchyard::Limit::parse(spec))
                .collect::<switchyard::Result<Vec<_>>>()?,
        );
    let options = match &args.name {
        Some(name) => options.with_name(name.clone()),
        None => options,
    };
    Ok(options)
}

/// One line per tenant's report (`tenant` named only when serving several).
fn print_reports(
    reports: Vec<(Option<String>, WorkerReport)>,
    several: bool,
    json: bool,
) -> Result<()> {
    for (tenant, report) in reports {
        let tenant = tenant.filter(|_| several);
        if json {
            let mut line = serde_json::to_value(report)
                .map_err(|e| switchyard::Error::InvalidInput(format!("report: {e}")))?;
            if let (Some(t), Some(obj)) = (&tenant, line.as_object_mut()) {
                obj.insert("tenant".into(), t.clone().into());
            }
            crate::output::json_line(&line)?;
        } else {
            let prefix = tenant.map(|t| format!("tenant {t}: ")).unwrap_or_default();
            outln!(
                "{prefix}handled {}, retried {}, dead-lettered {}, lost {}, released at shutdown {}",
                report.succeeded,
                report.retried,
                report.dead_lettered,
                report.lost,
                report.released_on_shutdown
            );
        }
    }
    Ok(())
}

/// The `--label` flags, checked here so that a bad one is named before anything connects.
fn labels_arg(labels: &[String]) -> Result<Vec<String>> {
    switchyard::labels::normalize(labels.to_vec()).map_err(|e| match e {
        switchyard::Error::InvalidInput(why) => {
            switchyard::Error::InvalidInput(format!("--label: {why}"))
        }
        other => other,
    })
}

/// What every tenant's worker of one `work` shares.
pub(super) struct Serving {
    /// `--schema` names several tenants (or a pattern): errors name their tenant.
    several: bool,
    /// `--tenant-rescan`.
    rescan_every: Duration,
    queue: QueueName,
    options: WorkerOptions,
    command: String,
    /// Whether the command's stderr lines are the job's log.
    stderr_log: bool,
    prune_older_than: Option<Duration>,
    control: Option<Arc<control_socket::ControlSocket>>,
    sources: crate::metrics_listener::Sources,
    shutdown: CancellationToken,
    abort: CancellationToken,
}
