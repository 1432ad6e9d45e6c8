//! The admin server's flow controls: what is paused, the limits' keys and the
//! schedules with their next runs (`GET /api/controls`, `GET /api/schedules`), pausing and resuming a queue or kind (`POST /api/pause`,
//! `POST /api/resume`), and cancelling a job (`POST /api/jobs/{id}/cancel`), each change
//! behind the admin token.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use switchyard::{Controls, QueueName};
use uuid::Uuid;

use super::{check_mutation, problem, Answer, App, Shared};

/// The store's controls, or why there are none.
fn controls(app: &App) -> Result<Arc<dyn Controls>, super::ApiError> {
    app.store.as_ref().and_then(|s| s.controls()).ok_or_else(|| {
        problem(
            StatusCode::NOT_IMPLEMENTED,
            "pause and cancel need the SQL store beside the jobs (job status is off, or RabbitMQ has no DATABASE_URL)",
        )
    })
}

/// Paused queues and kinds, and each limit key's slots and bucket (empty lists where
/// the store keeps none).
pub(super) async fn overview(State(app): Shared) -> Answer {
    let store = app.store.as_ref();
    let paused = match store.and_then(|s| s.controls()) {
        Some(c) => c.paused().await?,
        None => Vec::new(),
    };
    let limits = match store.and_then(|s| s.limits()) {
        Some(l) => l.usage().await?,
        None => Vec::new(),
    };
    Ok(Json(serde_json::json!({
        "available": store.is_some_and(|s| s.controls().is_some()),
        "paused": paused,
        "limits": limits,
        // The panel's other parts stay useful when the schedules cannot be read.
        "schedules": schedule_list(&app).await.unwrap_or_default(),
    }))
    .into_response())
}

/// Every schedule with its next run (`GET /api/schedules`; empty where the store keeps
/// none).
pub(super) async fn schedules(State(app): Shared) -> Answer {
    Ok(Json(serde_json::json!({ "schedules": schedule_list(&app).await? })).into_response())
}

async fn schedule_list(
    app: &App,
) -> Result<Vec<switchyard::schedule::ScheduleInfo>, super::ApiError> {
    let Some(store) = app.store.as_ref().and_then(|s| s.schedules()) else {
        return Ok(Vec::new());
    };
    let now = chrono::Utc::now().timestamp_micros();
    switchyard::schedule::list_schedules(store.as_ref(), now)
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "listing the schedules failed");
            e.into()
        })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PauseRequest {
    queue: String,
    #[serde(default)]
    kind: Option<String>,
}

fn pause_request(body: &[u8]) -> Result<(QueueName, Option<String>), super::ApiError> {
    let req: PauseRequest = serde_json::from_slice(body).map_err(|e| {
        problem(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}; expected {{\"queue\": \"…\"}} with an optional \"kind\""),
        )
    })?;
    let queue = QueueName::new(req.queue)?;
    if req.kind.as_ref().is_some_and(|k| k.trim().is_empty()) {
        return Err(problem(
            StatusCode::BAD_REQUEST,
            "\"kind\" is empty: name a job kind, or leave it out (or null) for the whole queue",
        ));
    }
    Ok((queue, req.kind))
}

pub(super) async fn pause(
    State(app): Shared,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Answer {
    check_mutation(&app, &headers)?;
    let (queue, kind) = pause_request(&body)?;
    controls(&app)?
        .pause(queue.as_str(), kind.as_deref())
        .await?;
    Ok(
        Json(serde_json::json!({ "paused": { "queue": queue.as_str(), "kind": kind } }))
            .into_response(),
    )
}

pub(super) async fn resume(
    State(app): Shared,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Answer {
    check_mutation(&app, &headers)?;
    let (queue, kind) = pause_request(&body)?;
    let was = controls(&app)?
        .resume(queue.as_str(), kind.as_deref())
        .await?;
    Ok(Json(serde_json::json!({
        "resumed": { "queue": queue.as_str(), "kind": kind },
        "was_paused": was,
    }))
    .into_response())
}

pub(super) async fn cancel(
    State(app): Shared,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Answer {
    check_mutation(&app, &headers)?;
    let id = Uuid::parse_str(id.trim()).map_err(|_| {
        problem(
            StatusCode::BAD_REQUEST,
            format!("{id:?} is not a job id (a UUID)"),
        )
    })?;
    let controls = controls(&app)?;
    if let Some(store) = &app.store {
        if let Some(status) = store.get(id).await? {
            if status.state.is_final() {
                return Err(problem(
                    StatusCode::CONFLICT,
                    format!("job {id} already ended {}: nothing to cancel", status.state),
                ));
            }
        }
    }
    controls.cancel(&[id]).await?;
    Ok(Json(serde_json::json!({ "cancelled": id })).into_response())
}
