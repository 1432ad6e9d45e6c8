//! W3C Trace Context with an in-process exporter: an envelope built inside a span
//! carries its `traceparent`; the handler's span of the first attempt is that span's
//! child, in its trace; a retry's span starts a trace of its own with a link back.
#![cfg(all(feature = "otel", feature = "sqlite"))]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::trace::{SpanContext, TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use switchyard::worker::{handler_fn, JobContext, JobError, RetryPolicy, Worker, WorkerOptions};
use switchyard::{Config, Envelope, QueueName, TransportExt};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt as _;

#[tokio::test(flavor = "current_thread")]
async fn a_job_continues_the_trace_it_was_published_in_and_a_retry_links_to_it() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    tracing::subscriber::set_global_default(subscriber).expect("the test's subscriber");

    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("jobs.db").display());
    let config = Config::from_lookup(|name| (name == "DATABASE_URL").then(|| url.clone()))
        .expect("a configuration");
    let jobs = switchyard::connect_jobs(&config).await.expect("connect");

    let checkout = tracing::info_span!("checkout");
    let envelope = {
        let _in = checkout.enter();
        Envelope::builder("charges", "charge")
            .build()
            .expect("an envelope")
    };
    let parent: SpanContext = checkout.context().span().span_context().clone();
    assert!(parent.is_valid());
    let traceparent = envelope.headers.get("traceparent").expect("a traceparent");
    assert_eq!(
        traceparent,
        &format!("00-{}-{}-01", parent.trace_id(), parent.span_id())
    );
    assert_eq!(
        envelope.trace_id.as_deref(),
        Some(parent.trace_id().to_string().as_str())
    );
    jobs.transport().publish(envelope).await.expect("publish");
    drop(checkout);

    // Each attempt's handler notes the span it runs in.
    let seen: Arc<Mutex<Vec<SpanContext>>> = Arc::default();
    let noted = seen.clone();
    let options = WorkerOptions::default()
        .with_drain(true)
        .with_retry(RetryPolicy::new(
            Duration::from_millis(10),
            Duration::from_millis(20),
            3,
        ));
    let worker = Worker::for_jobs(&jobs, QueueName::new("charges").expect("a name"), options)
        .handle(
            "charge",
            handler_fn(move |ctx: JobContext| {
                let noted = noted.clone();
                async move {
                    let here = tracing::Span::current()
                        .context()
                        .span()
                        .span_context()
                        .clone();
                    noted.lock().expect("the record").push(here);
                    if ctx.attempt == 1 {
                        return Err(JobError::retry("the card network timed out"));
                    }
                    Ok(())
                }
            }),
        );
    let report = worker
        .run(switchyard::CancellationToken::new())
        .await
        .expect("the worker");
    assert_eq!(report.succeeded, 1, "{report:?}");
    provider.force_flush().expect("flush");

    let spans = exporter.get_finished_spans().expect("the spans");
    let jobs_spans: Vec<_> = spans.iter().filter(|s| s.name == "job").collect();
    assert_eq!(jobs_spans.len(), 2, "{spans:#?}");
    let seen = seen.lock().expect("the record").clone();
    let first = jobs_spans
        .iter()
        .find(|s| s.span_context.span_id() == seen[0].span_id())
        .expect("the first attempt's span");
    let retry = jobs_spans
        .iter()
        .find(|s| s.span_context.span_id() == seen[1].span_id())
        .expect("the retry's span");
    assert_eq!(
        first.span_context.trace_id(),
        parent.trace_id(),
        "one trace"
    );
    assert_eq!(
        first.parent_span_id,
        parent.span_id(),
        "the publisher's child"
    );
    assert_ne!(
        retry.span_context.trace_id(),
        parent.trace_id(),
        "a trace of its own"
    );
    assert!(
        retry
            .links
            .iter()
            .any(|l| l.span_context.trace_id() == parent.trace_id()
                && l.span_context.span_id() == parent.span_id()),
        "the retry links to the publisher: {:?}",
        retry.links
    );
}
