//! Spans exported through OpenTelemetry's OTLP exporter, over HTTP (feature `otlp`),
//! configured by the standard variables:
//!
//! | variable | |
//! |---|---|
//! | `OTEL_EXPORTER_OTLP_ENDPOINT` | the collector, e.g. `http://127.0.0.1:4318` (`/v1/traces` is added) |
//! | `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` | the full traces URL, instead |
//! | `OTEL_EXPORTER_OTLP_PROTOCOL` (`_TRACES_PROTOCOL`) | `http/protobuf` (the default) or `http/json` |
//! | `OTEL_EXPORTER_OTLP_HEADERS` (`_TRACES_HEADERS`), `OTEL_EXPORTER_OTLP_COMPRESSION` | as the exporter reads them |
//! | `OTEL_EXPORTER_OTLP_TIMEOUT` (`_TRACES_TIMEOUT`) | ms per export, 10,000 by default |
//! | `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES` | the resource; when neither names the service, the name given to [`Otlp::from_env`] |
//! | `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`, `OTEL_BSP_*` | as the SDK reads them |
//! | `OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none` | export nothing |
//!
//! Nothing is exported unless an endpoint is set, or `OTEL_TRACES_EXPORTER=otlp` asks for
//! the default endpoint, `http://localhost:4318`. `https://` endpoints use rustls (ring)
//! with the system's root certificates. An export that fails (an unreachable collector, a
//! refusal) is logged through `tracing` at the target `opentelemetry*`, which the layer
//! should not export (filter it, as below). [`Otlp::from_env`] also sets OpenTelemetry's
//! global tracer provider and W3C propagator. Envelopes carry the context of spans made by
//! this crate's OpenTelemetry versions (opentelemetry 0.33, tracing-opentelemetry 0.34):
//! an application on other versions gets no propagation. See [the tracing
//! guide](https://github.com/switchyard-rs/switchyard/blob/main/docs/tracing.md).
//!
//! ```no_run
//! use tracing_subscriber::layer::SubscriberExt as _;
//! use tracing_subscriber::util::SubscriberInitExt as _;
//!
//! # fn main() -> switchyard::Result<()> {
//! use tracing_subscriber::Layer as _;
//! let otlp = switchyard::otlp::Otlp::from_env("billing")?;
//! // The exporter's own log lines stay out of what it exports.
//! let ours = tracing_subscriber::filter::Targets::new()
//!     .with_default(tracing::Level::INFO)
//!     .with_target("opentelemetry", tracing::level_filters::LevelFilter::OFF)
//!     .with_target("opentelemetry_sdk", tracing::level_filters::LevelFilter::OFF)
//!     .with_target("opentelemetry_otlp", tracing::level_filters::LevelFilter::OFF);
//! tracing_subscriber::registry()
//!     .with(otlp.as_ref().map(|o| o.layer().with_filter(ours)))
//!     .init();
//! // … run the application …
//! if let Some(otlp) = otlp {
//!     otlp.shutdown(); // sends what is still buffered
//! }
//! # Ok(())
//! # }
//! ```

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};
use opentelemetry_sdk::Resource;
use tracing_subscriber::registry::LookupSpan;

use crate::{ConfigError, Error, Result};

/// An OTLP exporter and the tracer provider that batches spans for it.
#[derive(Debug)]
pub struct Otlp {
    provider: SdkTracerProvider,
}

impl Otlp {
    /// The exporter the `OTEL_*` variables describe, or `None` when they ask for none;
    /// `service` names the service when neither `OTEL_SERVICE_NAME` nor
    /// `OTEL_RESOURCE_ATTRIBUTES` does. An `OTEL_*` value it cannot use is an error that
    /// names it.
    pub fn from_env(service: &str) -> Result<Option<Otlp>> {
        let get = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let Some(protocol) = wanted(&get)? else {
            return Ok(None);
        };
        let timeout = timeout(&get)?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(protocol)
            .with_http_client(Client::new(timeout))
            .build()
            .map_err(|e| Error::InvalidInput(format!("cannot set up the OTLP exporter: {e}")))?;
        let named = get("OTEL_SERVICE_NAME").is_some()
            || get("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| {
                a.split(',')
                    .any(|kv| kv.trim_start().starts_with("service.name="))
            });
        let mut resource = Resource::builder();
        if !named {
            resource = resource.with_service_name(service.to_owned());
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        opentelemetry::global::set_tracer_provider(provider.clone());
        Ok(Some(Otlp { provider }))
    }

    /// The `tracing` layer that turns spans into exported ones.
    pub fn layer<S>(&self) -> tracing_opentelemetry::OpenTelemetryLayer<S, Tracer>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        tracing_opentelemetry::layer().with_tracer(self.provider.tracer("switchyard"))
    }

    /// Sends the spans still buffered and stops the exporter.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "the OTLP exporter did not shut down cleanly");
        }
    }
}

/// The protocol to export with, when the variables ask for an export.
fn wanted(get: &impl Fn(&str) -> Option<String>) -> Result<Option<Protocol>> {
    if get("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    match get("OTEL_TRACES_EXPORTER").map(|v| v.trim().to_ascii_lowercase()) {
        Some(v) if v == "none" => return Ok(None),
        Some(v) if v == "otlp" => {}
        Some(v) => {
            return Err(ConfigError::new(
                "OTEL_TRACES_EXPORTER",
                Some(v),
                "otlp or none (this build exports OTLP over HTTP)",
            )
            .into())
        }
        None if get("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
            && get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none() =>
        {
            return Ok(None)
        }
        None => {}
    }
    let var = if get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").is_some() {
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    } else {
        "OTEL_EXPORTER_OTLP_PROTOCOL"
    };
    match get(var).map(|p| p.trim().to_ascii_lowercase()) {
        None => Ok(Some(Protocol::HttpBinary)),
        Some(p) if p == "http/protobuf" => Ok(Some(Protocol::HttpBinary)),
        Some(p) if p == "http/json" => Ok(Some(Protocol::HttpJson)),
        Some(p) => Err(ConfigError::new(
            var,
            Some(p),
            "http/protobuf or http/json (this build exports OTLP over HTTP, not gRPC)",
        )
        .into()),
    }
}

/// The time an export may take (`OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else
/// `OTEL_EXPORTER_OTLP_TIMEOUT`, in ms; 10 s by default).
fn timeout(get: &impl Fn(&str) -> Option<String>) -> Result<Duration> {
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ] {
        if let Some(v) = get(var) {
            return v
                .trim()
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| ConfigError::new(var, Some(v), "milliseconds, e.g. 10000").into());
        }
    }
    Ok(Duration::from_secs(10))
}

/// The exporter's HTTP client: reqwest's blocking client (the batch processor exports
/// from a thread of its own, outside any async runtime), made on first use there, since
/// one must not be made or dropped inside a runtime.
#[derive(Debug)]
struct Client {
    timeout: Duration,
    client: OnceLock<reqwest::blocking::Client>,
}

impl Client {
    fn new(timeout: Duration) -> Self {
        Client {
            timeout,
            client: OnceLock::new(),
        }
    }
}

/// The largest collector answer read.
const MAX_ANSWER: u64 = 4 * 1024 * 1024;

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(
        &self,
        request: Request<Bytes>,
    ) -> std::result::Result<Response<Bytes>, HttpError> {
        use std::io::Read as _;
        let client = match self.client.get() {
            Some(client) => client,
            None => {
                let built = reqwest::blocking::Client::builder()
                    .timeout(self.timeout)
                    .build()?;
                self.client.get_or_init(|| built)
            }
        };
        let request = reqwest::blocking::Request::try_from(request)?;
        let mut response = client.execute(request)?;
        let status = response.status();
        let headers = std::mem::take(response.headers_mut());
        let mut body = Vec::new();
        response.take(MAX_ANSWER).read_to_end(&mut body)?;
        let mut answer = Response::builder().status(status).body(Bytes::from(body))?;
        *answer.headers_mut() = headers;
        Ok(answer)
    }
}
