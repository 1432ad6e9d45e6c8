//! `switchyard serve`: the admin server. A dashboard page (embedded in the binary), a
//! JSON API over the queues, dead letters and job status, Server-Sent Events that follow
//! one job, and Prometheus metrics.
//!
//! Reads are open to whoever can reach the address (127.0.0.1 by default). The mutating
//! endpoints (replay, purge) require `Authorization: Bearer $SWITCHYARD_ADMIN_TOKEN`
//! when that variable is set, a JSON body, and refuse requests a browser marks as
//! cross-site, so a page on another site cannot make a visitor's browser replay or purge.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use switchyard::status::{next_change, JobFilter};
use switchyard::{
    parse_duration, CancellationToken, Config, ConfigError, DeadSelection, Error, HeldSelection,
    JobState, QueueName, Result, StatusStore, Transport,
};
use uuid::Uuid;

use crate::cli::ServeArgs;
use crate::host_guard::{guard_host, Loopback};
use crate::metrics_listener;

mod controls;

const DASHBOARD_HTML: &str = include_str!("../../../assets/dashboard.html");
const DASHBOARD_JS: &str = include_str!("../../../assets/dashboard.js");
const DASHBOARD_CSS: &str = include_str!("../../../assets/dashboard.css");

/// The throughput chart: finished jobs per 10 s over the last 5 minutes.
const CHART_BUCKET: Duration = Duration::from_secs(10);
const CHART_WINDOW: Duration = Duration::from_secs(300);
/// A job's event stream ends after this long even if the job never finishes.
const EVENTS_MAX: Duration = Duration::from_secs(3600);

struct App {
    transport: Arc<dyn Transport>,
    /// The tenant whose store this is (`--schema`): the label of its metrics.
    tenant: Option<String>,
    store: Option<Arc<dyn StatusStore>>,
    metrics: PrometheusHandle,
    token: Option<String>,
    /// Listening on a loopback address: requests must name a loopback host too.
    loopback: bool,
    /// Room for more job event streams.
    streams: Arc<tokio::sync::Semaphore>,
}

/// Job event streams open at once, at most.
const MAX_STREAMS: usize = 256;

type Shared = State<Arc<App>>;

pub(crate) async fn run(config: &Config, args: ServeArgs) -> Result<()> {
    let addr = crate::listen::parse_listen("--listen", &args.listen)?;
    let token = std::env::var("SWITCHYARD_ADMIN_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty());
    if !addr.ip().is_loopback() && token.is_none() {
        tracing::warn!(%addr, "serving beyond this machine with no SWITCHYARD_ADMIN_TOKEN: anyone who reaches it can replay and purge dead letters");
    }
    let alerting = crate::alerts::Alerting::from_args(&args)?;
    let metrics = metrics_listener::install_recorder()?;
    let jobs = switchyard::connect_jobs(config).await?;
    let (transport, store) = (jobs.transport().clone(), jobs.store().cloned());
    let app = Arc::new(App {
        transport,
        tenant: config.tenant.as_ref().map(|t| t.as_str().to_owned()),
        store,
        metrics,
        token,
        loopback: addr.ip().is_loopback(),
        streams: Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS)),
    });
    let listener = crate::listen::bind(addr).await?;
    let local = listener.local_addr().unwrap_or(addr);
    // The first line says where it listens (with port 0, the port it got).
    outln!("switchyard serve: listening on http://{local}/");
    let shutdown = CancellationToken::new();
    crate::signals::spawn_signal_handler(shutdown.clone(), CancellationToken::new())?;
    if let Some(alerting) = alerting {
        crate::alerts::spawn(
            alerting,
            app.transport.clone(),
            app.store.clone(),
            shutdown.clone(),
        );
    }
    axum::serve(listener, router(app))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .map_err(|e| Error::io("the admin server stopped", e))
}

fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(dashboard))
        .route("/assets/dashboard.js", get(dashboard_js))
        .route("/assets/dashboard.css", get(dashboard_css))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/api/stats", get(stats))
        .route("/api/jobs", get(list_jobs))
        .route("/api/counts", get(counts))
        .route("/api/workers", get(workers))
        .route("/api/held", get(held))
        .route("/api/jobs/{id}", get(job))
        .route("/api/jobs/{id}/view", get(job_view))
        .route("/api/jobs/{id}/events", get(job_events))
        .route("/api/dead", get(dead_list))
        .route("/api/dead/replay", post(dead_replay))
        .route("/api/dead/purge", post(dead_purge))
        .route("/api/controls", get(controls::overview))
        .route("/api/schedules", get(controls::schedules))
        .route("/api/pause", post(controls::pause))
        .route("/api/resume", post(controls::resume))
        .route("/api/jobs/{id}/cancel", post(controls::cancel))
        .layer(axum::middleware::from_fn_with_state(
            Loopback(app.loopback),
            guard_host,
        ))
        .with_state(app)
}

/// An error answer: its status and `{"error": message}`.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
    bearer: bool,
}

fn problem(status: StatusCode, message: impl Into<String>) -> ApiError {
    ApiError {
        status,
        message: message.into(),
        bearer: false,
    }
}

impl From<Error> for ApiError {
    fn from(err: Error) -> Self {
        let status = match &err {
            Error::InvalidInput(_) | Error::Config(_) | Error::NotSupported(_) => {
                StatusCode::BAD_REQUEST
            }
            Error::NotFound { .. } => StatusCode::NOT_FOUND,
            Error::Conflict(_) => StatusCode::CONFLICT,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        problem(status, crate::output::one_line(&err))
    }
}

impl From<ConfigError> for ApiError {
    fn from(err: ConfigError) -> Self {
        Error::from(err).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            Json(serde_json::json!({ "error": self.message })),
        )
            .into_response();
        if self.bearer {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

type Answer = std::result::Result<Response, ApiError>;

/// Headers of the dashboard's own files: no framing by other sites, nothing loaded from
/// elsewhere.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(
                    "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'none'",
                ),
            ),
            (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}

async fn dashboard() -> Response {
    asset("text/html; charset=utf-8", DASHBOARD_HTML)
}

async fn dashboard_js() -> Response {
    asset("text/javascript; charset=utf-8", DASHBOARD_JS)
}

async fn dashboard_css() -> Response {
    asset("text/css; charset=utf-8", DASHBOARD_CSS)
}

async fn healthz(State(app): Shared) -> Answer {
    Ok(Json(metrics_listener::health(app.transport.as_ref()).await?).into_response())
}

async fn metrics(State(app): Shared) -> Response {
    let source = metrics_listener::Gauged {
        tenant: app.tenant.clone(),
        transport: app.transport.clone(),
        store: app.store.clone(),
    };
    metrics_listener::render(&[source], &app.metrics).await
}

async fn stats(State(app): Shared) -> Answer {
    let queues = app.transport.stats(None).await?;
    let throughput = match &app.store {
        Some(store) => Some(store.throughput(CHART_WINDOW, CHART_BUCKET).await?),
        None => None,
    };
    Ok(Json(serde_json::json!({
        "transport": app.transport.name(),
        "queues": queues,
        "throughput": throughput,
        "bucket_seconds": CHART_BUCKET.as_secs(),
        "window_seconds": CHART_WINDOW.as_secs(),
        "status_store": app.store.is_some(),
        "holders": app.transport.capabilities().holders,
        "token_required": app.token.is_some(),
    }))
    .into_response())
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    limit: Option<usize>,
    queue: Option<String>,
}

/// `/api/jobs?queue=Q&state=S&q=TEXT&limit=N&offset=M`.
#[derive(Debug, Deserialize)]
struct JobsQuery {
    limit: Option<usize>,
    offset: Option<usize>,
    queue: Option<String>,
    state: Option<String>,
    q: Option<String>,
}

fn store_of(app: &App) -> std::result::Result<&Arc<dyn StatusStore>, ApiError> {
    app.store.as_ref().ok_or_else(|| {
        problem(
            StatusCode::NOT_FOUND,
            "job status is off: it needs a SQL store (DATABASE_URL) and QUEUE_STATUS=on",
        )
    })
}

/// Jobs by queue, state and search (the start of an id, or a kind), newest change
/// first, a page at a time.
async fn list_jobs(State(app): Shared, Query(q): Query<JobsQuery>) -> Answer {
    let mut filter = JobFilter::new(q.limit.unwrap_or(20)).offset(q.offset.unwrap_or(0));
    if let Some(queue) = q.queue.filter(|v| !v.is_empty()) {
        filter = filter.queue(queue);
    }
    if let Some(state) = q.state.filter(|v| !v.is_empty()) {
        let parsed = JobState::parse(&state).ok_or_else(|| {
            problem(
                StatusCode::BAD_REQUEST,
                format!("invalid state {state:?}: expected pending, running, retrying, completed, failed or dead"),
            )
        })?;
        filter = filter.state(parsed);
    }
    if let Some(text) = q.q {
        filter = filter.search(text);
    }
    let jobs = store_of(&app)?.list(&filter).await?;
    Ok(Json(jobs).into_response())
}

/// Jobs per queue and state.
async fn counts(State(app): Shared) -> Answer {
    Ok(Json(store_of(&app)?.counts().await?).into_response())
}

/// Workers heard from in the last 30 s.
async fn workers(State(app): Shared) -> Answer {
    Ok(Json(store_of(&app)?.workers().await?).into_response())
}

/// Messages workers hold now, with their holders and leases' ends, longest held first.
async fn held(State(app): Shared, Query(q): Query<ListQuery>) -> Answer {
    let queue = q.queue.as_deref().map(QueueName::new).transpose()?;
    let held = app
        .transport
        .held(
            HeldSelection::Queue(queue.as_ref()),
            q.limit.unwrap_or(200).min(1000),
        )
        .await?;
    Ok(Json(held).into_response())
}

/// One job with its failed attempts and where it is (what `switchyard job` shows).
async fn job_view(State(app): Shared, Path(id): Path<String>) -> Answer {
    let id = job_id(&id)?;
    match crate::job_view::find(&app.transport, app.store.as_ref(), id).await? {
        Some(view) => Ok(Json(view).into_response()),
        None => Err(problem(
            StatusCode::NOT_FOUND,
            format!("no job {id}: no status record and no dead letter"),
        )),
    }
}

fn job_id(id: &str) -> std::result::Result<Uuid, ApiError> {
    Uuid::parse_str(id).map_err(|_| {
        problem(
            StatusCode::BAD_REQUEST,
            format!("invalid job id {id:?}: expected a UUID"),
        )
    })
}

async fn job(State(app): Shared, Path(id): Path<String>) -> Answer {
    let (store, id) = (store_of(&app)?, job_id(&id)?);
    match store.get(id).await? {
        Some(status) => Ok(Json(status).into_response()),
        None => Err(problem(
            StatusCode::NOT_FOUND,
            format!("no job {id} is recorded"),
        )),
    }
}

/// Follows one job: an event `status` (the job's record as JSON, `id:` its version) for
/// each change, in order, and the stream ends after the final state.
async fn job_events(State(app): Shared, Path(id): Path<String>) -> Answer {
    let (store, id) = (store_of(&app)?.clone(), job_id(&id)?);
    // Held by the stream until it ends.
    let permit = app.streams.clone().try_acquire_owned().map_err(|_| {
        problem(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{MAX_STREAMS} job event streams are open already; try again later"),
        )
    })?;
    let Some(first) = store.get(id).await? else {
        return Err(problem(
            StatusCode::NOT_FOUND,
            format!("no job {id} is recorded"),
        ));
    };
    let deadline = tokio::time::Instant::now() + EVENTS_MAX;
    let state = (store, Some(first), 0_u64, false, permit);
    let events = futures_util::stream::unfold(
        state,
        move |(store, first, version, ended, permit)| async move {
            if ended {
                return None;
            }
            let next = match first {
                Some(status) => Ok(Some(status)),
                None => next_change(store.as_ref(), id, version, deadline).await,
            };
            match next {
                Ok(Some(status)) => {
                    let event = Event::default()
                        .event("status")
                        .id(status.version.to_string())
                        .json_data(&status)
                        .unwrap_or_else(|_| Event::default().event("status"));
                    let done = status.state.is_final();
                    Some((
                        Ok::<_, Infallible>(event),
                        (store, None, status.version, done, permit),
                    ))
                }
                Ok(None) => None,
                Err(err) => {
                    let event = Event::default()
                        .event("error")
                        .data(crate::output::one_line(&err));
                    Some((Ok(event), (store, None, version, true, permit)))
                }
            }
        },
    );
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

async fn dead_list(State(app): Shared, Query(q): Query<ListQuery>) -> Answer {
    let queue = q.queue.as_deref().map(QueueName::new).transpose()?;
    let dead = app
        .transport
        .dead_list(queue.as_ref(), q.limit.unwrap_or(50).min(1000))
        .await?;
    let rows: Vec<serde_json::Value> = dead.iter().map(crate::payload::with_payload).collect();
    Ok(Json(rows).into_response())
}

/// What to replay or purge: exactly one of `id`, `ids` (a selection), `all` or (purge
/// only) `older_than`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadRequest {
    id: Option<String>,
    ids: Option<Vec<String>>,
    #[serde(default)]
    all: bool,
    older_than: Option<String>,
    queue: Option<String>,
}

impl DeadRequest {
    /// The queue, and one selection per call to make (`ids`: one per id).
    fn selections(&self, purge: bool) -> Result<(Option<QueueName>, Vec<DeadSelection>)> {
        let queue = self.queue.as_deref().map(QueueName::new).transpose()?;
        let selections = match (&self.id, &self.ids, self.all, &self.older_than) {
            (Some(id), None, false, None) => vec![DeadSelection::Id(id.clone())],
            (None, Some(ids), false, None) if !ids.is_empty() && ids.len() <= MAX_SELECTED => {
                ids.iter().cloned().map(DeadSelection::Id).collect()
            }
            (None, None, true, None) => vec![DeadSelection::All],
            (None, None, false, Some(age)) if purge => {
                vec![DeadSelection::OlderThan(parse_duration("older_than", age)?)]
            }
            _ => {
                return Err(Error::InvalidInput(format!(
                    "give exactly one of \"id\", \"ids\" (1 to {MAX_SELECTED} of them), \"all\": true{}",
                    if purge { " or \"older_than\": \"30d\"" } else { "" }
                )))
            }
        };
        Ok((queue, selections))
    }
}

/// Refuses a mutating request that a browser marks as coming from another site, that
/// carries no JSON body (a plain form post could), or that lacks the admin token.
fn check_mutation(app: &App, headers: &HeaderMap) -> std::result::Result<(), ApiError> {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site")) {
        if !matches!(site, "same-origin" | "none") {
            return Err(problem(
                StatusCode::FORBIDDEN,
                format!("cross-site request refused (Sec-Fetch-Site: {site})"),
            ));
        }
    }
    if let Some(origin) = text(header::ORIGIN) {
        let host = text(header::HOST).unwrap_or_default();
        let same = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|o| o.eq_ignore_ascii_case(host));
        if !same {
            return Err(problem(
                StatusCode::FORBIDDEN,
                format!("cross-site request refused (Origin {origin} is not this server, {host})"),
            ));
        }
    }
    let json = text(header::CONTENT_TYPE).is_some_and(|t| {
        t.split(';')
            .next()
            .is_some_and(|t| t.trim() == "application/json")
    });
    if !json {
        return Err(problem(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "expected a JSON body (Content-Type: application/json)",
        ));
    }
    if let Some(token) = &app.token {
        let given = text(header::AUTHORIZATION)
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        if !same_secret(given.trim().as_bytes(), token.trim().as_bytes()) {
            return Err(ApiError {
                bearer: true,
                ..problem(
                    StatusCode::UNAUTHORIZED,
                    "this server needs Authorization: Bearer <SWITCHYARD_ADMIN_TOKEN> to change anything",
                )
            });
        }
    }
    Ok(())
}

/// Compares without stopping at the first difference, so the time taken does not tell
/// how much of a guess was right.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, x) in a.iter().enumerate() {
        diff |= usize::from(x ^ b.get(i % b.len().max(1)).copied().unwrap_or(0));
    }
    diff == 0
}

fn dead_request(body: &[u8]) -> std::result::Result<DeadRequest, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        problem(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}; expected {{\"id\": \"…\"}}, {{\"ids\": [\"…\"]}}, {{\"all\": true}} or {{\"older_than\": \"30d\"}}, with an optional \"queue\""),
        )
    })
}

/// The most dead letters one request may name.
const MAX_SELECTED: usize = 1000;

async fn dead_replay(State(app): Shared, headers: HeaderMap, body: axum::body::Bytes) -> Answer {
    check_mutation(&app, &headers)?;
    let (queue, selections) = dead_request(&body)?.selections(false)?;
    let jobs = switchyard::Jobs::new(app.transport.clone(), app.store.clone());
    let mut total = 0;
    for selection in &selections {
        total += jobs.replay_dead(queue.as_ref(), selection).await?;
    }
    Ok(Json(serde_json::json!({ "replayed": total })).into_response())
}

async fn dead_purge(State(app): Shared, headers: HeaderMap, body: axum::body::Bytes) -> Answer {
    check_mutation(&app, &headers)?;
    let (queue, selections) = dead_request(&body)?.selections(true)?;
    let mut total = 0;
    for selection in &selections {
        total += app.transport.dead_purge(queue.as_ref(), selection).await?;
    }
    Ok(Json(serde_json::json!({ "purged": total })).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"s3cret", b"s3cret"));
        assert!(!same_secret(b"s3cre", b"s3cret"));
        assert!(!same_secret(b"s3cret!", b"s3cret"));
        assert!(!same_secret(b"", b"s3cret"));
        assert!(!same_secret(b"S3cret", b"s3cret"));
    }
}
