//! The CLI's spans exported over OTLP (feature `otlp`, on by default) when the `OTEL_*`
//! variables ask for it (see `switchyard::otlp`): the publish span whose context
//! envelopes carry, and each job's span. Only Switchyard's own spans go; library
//! events (sqlx's queries, lapin's frames) do not.

#[cfg(feature = "otlp")]
mod enabled {
    use tracing::Level;
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::registry::LookupSpan;
    use tracing_subscriber::Layer;

    /// The exporter.
    pub(crate) type Exporter = switchyard::otlp::Otlp;

    /// The exporter the environment asks for, if any. A setting it cannot use (say an
    /// agent's `OTEL_EXPORTER_OTLP_PROTOCOL=grpc`) is reported and exports nothing: it
    /// must not stop a command that has nothing to do with traces.
    pub(crate) fn start() -> Option<Exporter> {
        match switchyard::otlp::Otlp::from_env("switchyard") {
            Ok(otlp) => otlp,
            Err(e) => {
                errln!(
                    "switchyard: warning: not exporting traces: {}",
                    crate::output::one_line(&e)
                );
                None
            }
        }
    }

    /// Its layer, for Switchyard's spans only.
    pub(crate) fn layer<S>(otlp: &Exporter) -> impl Layer<S>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        let ours = Targets::new()
            .with_target("queue_core", Level::INFO)
            .with_target("switchyard", Level::INFO)
            .with_target("transport_sqlite", Level::INFO)
            .with_target("transport_pg", Level::INFO)
            .with_target("transport_mysql", Level::INFO)
            .with_target("transport_amqp", Level::INFO);
        otlp.layer().with_filter(ours)
    }

    /// Sends what is buffered.
    pub(crate) fn stop(otlp: Option<Exporter>) {
        if let Some(otlp) = otlp {
            otlp.shutdown();
        }
    }
}

#[cfg(not(feature = "otlp"))]
mod enabled {
    /// No exporter in this build.
    #[derive(Debug)]
    pub(crate) struct Exporter;

    pub(crate) fn start() -> Option<Exporter> {
        None
    }

    pub(crate) fn layer(_: &Exporter) -> tracing_subscriber::layer::Identity {
        tracing_subscriber::layer::Identity::new()
    }

    pub(crate) fn stop(_: Option<Exporter>) {}
}

pub(crate) use enabled::{layer, start, stop};
