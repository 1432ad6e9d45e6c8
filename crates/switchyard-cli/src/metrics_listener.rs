//! `/metrics` and `/healthz`: the admin server (`serve`) answers them, and so does a
//! worker started with `work --metrics-listen`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use switchyard::{CancellationToken, Error, Result, StatusStore, Transport};

use crate::host_guard::{guard_host, Loopback};

/// Installs the Prometheus recorder for this process's metrics.
pub(crate) fn install_recorder() -> Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(switchyard::metrics::HANDLER_DURATION.to_owned()),
            &[
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                300.0,
            ],
        )
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| Error::InvalidInput(format!("cannot set up the metrics recorder: {e}")))?;
    switchyard::metrics::describe();
    Ok(handle)
}

/// The health answer: `{"status": "ok", "transport": …}` once the backend answers.
pub(crate) async fn health(transport: &dyn Transport) -> Result<serde_json::Value> {
    // RabbitMQ cannot list queues it has not used, so its check is the connection made
    // at start; the SQL stores answer a query.
    if transport.name() != "amqp" {
        transport.stats(None).await?;
    }
    Ok(serde_json::json!({ "status": "ok", "transport": transport.name() }))
}

/// One tenant's store (or the one store), read for the gauges.
#[derive(Clone)]
pub(crate) struct Gauged {
    pub(crate) tenant: Option<String>,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) store: Option<Arc<dyn StatusStore>>,
}

/// The stores a listener reads; a worker that finds new tenants adds theirs.
pub(crate) type Sources = Arc<Mutex<Vec<Gauged>>>;

/// The Prometheus text, with the queue gauges of each source read now (labelled with
/// its tenant), and the workers gauge too where there is a status store (`serve`'s).
pub(crate) async fn render(sources: &[Gauged], handle: &PrometheusHandle) -> Response {
    for source in sources {
        let tenant = source.tenant.as_deref();
        let queues = match source.transport.stats(None).await {
            Ok(stats) => {
                switchyard::metrics::record_stats(tenant, &stats);
                stats
            }
            Err(err) => {
                tracing::debug!(error = %err, tenant, "no queue gauges");
                Vec::new()
            }
        };
        if let Some(store) = &source.store {
            match store.workers().await {
                Ok(workers) => switchyard::metrics::record_workers(tenant, &queues, &workers),
                Err(err) => tracing::debug!(error = %err, tenant, "no worker gauges"),
            }
        }
    }
    handle.run_upkeep();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        handle.render(),
    )
        .into_response()
}

/// What a worker's metrics listener serves from.
struct Probe {
    sources: Sources,
    metrics: PrometheusHandle,
}

impl Probe {
    fn sources(&self) -> Vec<Gauged> {
        self.sources.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Serves `/metrics` and `/healthz` of a worker on `addr` until `stop`, over `sources`.
pub(crate) async fn spawn(
    addr: SocketAddr,
    sources: Sources,
    stop: CancellationToken,
) -> Result<()> {
    let probe = Arc::new(Probe {
        sources,
        metrics: install_recorder()?,
    });
    let listener = crate::listen::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr().unwrap_or(addr), "serving metrics");
    let routes = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .layer(axum::middleware::from_fn_with_state(
            Loopback(addr.ip().is_loopback()),
            guard_host,
        ))
        .with_state(probe);
    tokio::spawn(async move {
        let served = axum::serve(listener, routes)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(err) = served {
            tracing::error!(error = %err, "the metrics server stopped");
        }
    });
    Ok(())
}

/// Healthy when every tenant's backend answers; the first that does not is named.
async fn healthz(State(probe): State<Arc<Probe>>) -> Response {
    // A pattern that matches no tenant yet: up, serving none.
    let mut answer = Ok(serde_json::json!({ "status": "ok", "tenants": 0 }));
    for source in probe.sources() {
        answer = health(source.transport.as_ref())
            .await
            .map_err(|err| match &source.tenant {
                Some(tenant) => Error::backend(
                    "metrics",
                    err.is_transient(),
                    format!("tenant {tenant}: {err}"),
                ),
                None => err,
            });
        if answer.is_err() {
            break;
        }
    }
    match answer {
        Ok(answer) => Json(answer).into_response(),
        Err(err) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "error": crate::output::one_line(&err) })),
        )
            .into_response(),
    }
}

async fn metrics(State(probe): State<Arc<Probe>>) -> Response {
    render(&probe.sources(), &probe.metrics).await
}
