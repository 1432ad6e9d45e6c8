//! Spans exported through OpenTelemetry's OTLP exporter, over HTTP (feature `otlp`),
//! configured by the standard variables:
//!
//! | variable | |
//! |---|---|
//! | `OTEL_EXPORTER_OTLP_ENDPOINT` | the collector, e.g. `http://127.0.0.1:4318` (`/v1/traces` is added) |
//! | `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` | the full traces URL, instead |
//! | `OTEL_EXPORTER_OTLP_PROTOCOL` (`_TRACES_PROTOCOL`) | `http/protobuf` (the default) or `http/json` |
//! | `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT` | as the exporter reads them |
//! | `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES` | the resource (service name `switchyard` when unset) |
//! | `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG` | as the SDK reads them |
//! | `OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none` | export nothing |
//!
//! Nothing is exported unless an endpoint is set (or `OTEL_TRACES_EXPORTER=otlp` asks for
//! the default, `http://localhost:4318`). See the "Tracing" section of the guide.
//!
//! ```no_run
//! use tracing_subscriber::layer::SubscriberExt as _;
//! use tracing_subscriber::util::SubscriberInitExt as _;
//!
//! # fn main() -> switchyard::Result<()> {
//! let otlp = switchyard::otlp::Otlp::from_env()?;
//! tracing_subscriber::registry()
//!     .with(otlp.as_ref().map(|o| o.layer()))
//!     .init();
//! // … run the application …
//! if let Some(otlp) = otlp {
//!     otlp.shutdown(); // sends what is still buffered
//! }
//! # Ok(())
//! # }
//! ```

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
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
    /// The exporter the `OTEL_*` variables describe, or `None` when they ask for none.
    pub fn from_env() -> Result<Option<Otlp>> {
        Self::from_lookup(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
    }

    /// [`from_env`](Self::from_env) over another source of variables.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Option<Otlp>> {
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
        let protocol_var = if get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").is_some() {
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
        } else {
            "OTEL_EXPORTER_OTLP_PROTOCOL"
        };
        let protocol = match get(protocol_var).map(|p| p.trim().to_ascii_lowercase()) {
            None => Protocol::HttpBinary,
            Some(p) if p == "http/protobuf" => Protocol::HttpBinary,
            Some(p) if p == "http/json" => Protocol::HttpJson,
            Some(p) => {
                return Err(ConfigError::new(
                    protocol_var,
                    Some(p),
                    "http/protobuf or http/json (this build exports OTLP over HTTP, not gRPC)",
                )
                .into())
            }
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(protocol)
            .build()
            .map_err(|e| Error::InvalidInput(format!("cannot set up the OTLP exporter: {e}")))?;
        let mut resource = Resource::builder();
        if get("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("switchyard");
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
