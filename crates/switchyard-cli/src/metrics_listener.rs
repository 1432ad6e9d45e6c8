//! `/metrics` and `/healthz`: the admin server (`serve`) answers them, and so does a
//! worker started with `work --metrics-listen`.

use std::net::SocketAddr;
use std::sync::Arc;

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

/// The Prometheus text, with the queue gauges read now, and the workers gauge too when
/// there is a status store (`serve`'s).
pub(crate) async fn render(
    transport: &dyn Transport,
    store: Option<&dyn StatusStore>,
    handle: &PrometheusHandle,
) -> Response {
    let queues = match transport.stats(None).await {
        Ok(stats) => {
            switchyard::metrics::record_stats(&stats);
            stats
        }
        Err(err) => {
            tracing::debug!(error = %err, "no queue gauges");
            Vec::new()
        }
    };
    if let Some(store) = store {
        match store.workers().await {
            Ok(workers) => switchyard::metrics::record_workers(&queues, &workers),
            Err(err) => tracing::debug!(error = %err, "no worker gauges"),
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
    transport: Arc<dyn Transport>,
    metrics: PrometheusHandle,
}

/// Serves `/metrics` and `/healthz` of a worker on `addr` until `stop`.
pub(crate) async fn spawn(
    addr: SocketAddr,
    transport: Arc<dyn Transport>,
    stop: CancellationToken,
) -> Result<()> {
    let probe = Arc::new(Probe {
        transport,
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

async fn healthz(State(probe): State<Arc<Probe>>) -> Response {
    match health(probe.transport.as_ref()).await {
        Ok(answer) => Json(answer).into_response(),
        Err(err) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "error": crate::output::one_line(&err) })),
        )
            .into_response(),
    }
}

async fn metrics(State(probe): State<Arc<Probe>>) -> Response {
    render(probe.transport.as_ref(), None, &probe.metrics).await
}
