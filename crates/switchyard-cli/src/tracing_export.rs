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

    /// The exporter the environment asks for, if any.
    pub(crate) fn start() -> switchyard::Result<Option<Exporter>> {
        switchyard::otlp::Otlp::from_env()
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

    pub(crate) fn start() -> switchyard::Result<Option<Exporter>> {
        Ok(None)
    }

    pub(crate) fn layer(_: &Exporter) -> tracing_subscriber::layer::Identity {
        tracing_subscriber::layer::Identity::new()
    }

    pub(crate) fn stop(_: Option<Exporter>) {}
}

pub(crate) use enabled::{layer, start, stop};
