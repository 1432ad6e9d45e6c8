//! The CLI's spans exported over OTLP (feature `otlp`, on by default) when the `OTEL_*`
//! variables ask for it (see `switchyard::otlp`): the publish span whose context
//! envelopes carry, and each job's span. Only Switchyard's own spans go; library
//! events (sqlx's queries, lapin's frames) do not.

#[cfg(feature = "otlp")]
mod enabled {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use tracing::span::{Attributes, Id};
    use tracing::Level;
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::layer::Context;
    use tracing_subscriber::registry::LookupSpan;
    use tracing_subscriber::Layer;

    /// How long the exporter waits, at exit, for spans still open to close: long enough
    /// for a descheduled connection thread to run again on a busy machine, short enough
    /// not to hold up an exit; a span held longer (a statement stuck behind SQLite's busy
    /// timeout, say) is lost.
    const CLOSE_WAIT: Duration = Duration::from_millis(500);

    /// The exporter, and how many of the spans it exports are still open.
    #[derive(Debug)]
    pub(crate) struct Exporter {
        otlp: switchyard::otlp::Otlp,
        open: Arc<AtomicUsize>,
    }

    /// The exporter the environment asks for, if any. A setting it cannot use (say an
    /// agent's `OTEL_EXPORTER_OTLP_PROTOCOL=grpc`) is reported and exports nothing: it
    /// must not stop a command that has nothing to do with traces.
    pub(crate) fn start() -> Option<Exporter> {
        match switchyard::otlp::Otlp::from_env("switchyard") {
            Ok(otlp) => otlp.map(|otlp| Exporter {
                otlp,
                open: Arc::default(),
            }),
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
    pub(crate) fn layer<S>(exporter: &Exporter) -> impl Layer<S>
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
        exporter
            .otlp
            .layer()
            .and_then(Open(exporter.open.clone()))
            .with_filter(ours)
    }

    /// Counts the exported spans not yet closed. It sits under the OTLP layer's filter,
    /// so that it counts exactly the spans the exporter sees.
    struct Open(Arc<AtomicUsize>);

    impl<S: tracing::Subscriber> Layer<S> for Open {
        fn on_new_span(&self, _: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }

        // Runs after the OTLP layer has queued the span: the release makes it visible
        // to the exit's acquiring read, and so to the exporter's last send.
        fn on_close(&self, _: Id, _: Context<'_, S>) {
            self.0.fetch_sub(1, Ordering::Release);
        }
    }

    /// Sends what is buffered once the spans still open have closed, or after
    /// [`CLOSE_WAIT`]: a span is exported only when closed, and one can outlive the
    /// code that made it in a connection's thread (sqlx's SQLite thread holds the span
    /// that was current when a statement was sent until just after it has answered), which
    /// a busy machine may not run again before the process would exit.
    pub(crate) fn stop(exporter: Option<Exporter>) {
        if let Some(exporter) = exporter {
            let deadline = Instant::now() + CLOSE_WAIT;
            while exporter.open.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            exporter.otlp.shutdown();
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
