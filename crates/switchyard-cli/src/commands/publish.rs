//! `switchyard publish`: one message, or one per stdin line in batches.

use std::io::BufRead;

use switchyard::{parse_duration, Config, Envelope, EnvelopeBuilder, Error, Result, Unique};

use crate::cli::PublishArgs;

/// Messages per batch when publishing stdin lines.
const BATCH: usize = 500;

/// Publishes the `--payload`, or one message per stdin line, and prints their ids.
pub(crate) async fn run(config: &Config, args: PublishArgs, json: bool) -> Result<()> {
    // Everything is validated before the store is opened, so bad input writes nothing.
    let template = Template::new(&args)?;
    // The span whose trace context the envelopes carry (exported with
    // OTEL_EXPORTER_OTLP_ENDPOINT set). It is entered only while they are built: a span
    // current around SQLite I/O is held by sqlx's connection thread until it has sent
    // the answer back, and under load that thread let go of it only after this process
    // had sent its spans, so the span was never exported. Held to the end, it still
    // lasts as long as the publish.
    let span = tracing::info_span!("publish", queue = %args.queue);
    let envelopes = span.in_scope(|| build_envelopes(&args, &template))?;
    if envelopes.is_empty() {
        return Err(Error::InvalidInput(
            "no payload: give --payload JSON, or one JSON payload per stdin line".into(),
        ));
    }
    let wait = args
        .wait
        .as_deref()
        .map(|w| parse_duration("--wait", w))
        .transpose()?;
    if wait.is_some() && args.payload.is_none() {
        return Err(Error::InvalidInput(
            "--wait applies to one message: give --payload too".into(),
        ));
    }
    let jobs = switchyard::connect_jobs(config).await?;
    if let (Some(wait), Some(envelope)) = (wait, envelopes.first()) {
        return publish_and_wait(&jobs, envelope.clone(), wait, json).await;
    }
    let bar = crate::output::progress(envelopes.len() as u64, "publishing", json);
    let mut published = switchyard::Published::default();
    for chunk in envelopes.chunks(BATCH) {
        published.merge(jobs.publish_batch(chunk.to_vec()).await?);
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    for env in &envelopes {
        let dup = published.duplicate_of(env.id);
        if json {
            let mut line = serde_json::json!({
                "id": env.id, "queue": env.queue, "kind": env.kind,
            });
            if let Some(dup) = dup {
                line["duplicate_of"] = serde_json::json!(dup.existing);
                line["replaced"] = serde_json::json!(dup.replaced);
            }
            crate::output::json_line(&line)?;
        } else if let Some(dup) = dup {
            // The job that will run, so that a script follows it as it would a new one.
            outln!("{}", dup.existing);
            let how = if dup.replaced {
                "debounced its waiting job"
            } else {
                "stored nothing: its unique key is held by job"
            };
            errln!("switchyard: message {} {how} {}", env.id, dup.existing);
        } else {
            outln!("{}", env.id);
        }
    }
    Ok(())
}

/// The messages to publish: the one `--payload`, or one per stdin line.
fn build_envelopes(args: &PublishArgs, template: &Template) -> Result<Vec<Envelope>> {
    Ok(match &args.payload {
        Some(payload) => vec![template
            .builder()
            .raw_payload(payload.clone())
            .build()
            .map_err(|e| with_context(e, "--payload"))?],
        None => {
            if args.id.is_some() {
                return Err(Error::InvalidInput(
                    "--id applies to one message: give --payload too, or drop --id for stdin lines"
                        .into(),
                ));
            }
            read_stdin(template)?
        }
    })
}

/// Publishes one message and prints its result: the handler's JSON as it is (under
/// `--json`, `{"id", "state", "result"}`). A failure or a timeout prints its reason and
/// sets the exit code (1, or 124 like timeout(1)).
async fn publish_and_wait(
    jobs: &switchyard::Jobs,
    envelope: Envelope,
    wait: std::time::Duration,
    json: bool,
) -> Result<()> {
    let id = envelope.id;
    match jobs.publish_and_wait(envelope, wait).await {
        Ok(result) => {
            if json {
                crate::output::json_line(&serde_json::json!({
                    "id": id, "state": "completed", "result": result,
                }))
            } else {
                crate::output::json_line(&result)
            }
        }
        Err(switchyard::WaitError::Failed(status)) => {
            if json {
                crate::output::json_line(&*status)?;
            }
            crate::output::set_exit_code(1);
            Err(Error::InvalidInput(format!(
                "job {id} ended {} after {} attempt{}: {}",
                status.state,
                status.attempts,
                if status.attempts == 1 { "" } else { "s" },
                status.last_error.as_deref().unwrap_or("no error recorded")
            )))
        }
        Err(switchyard::WaitError::TimedOut { last, .. }) => {
            crate::output::set_exit_code(124);
            Err(Error::InvalidInput(format!(
                "no answer from job {id} within {} (it is {}; it may still run: `curl …/api/jobs/{id}` or wait again)",
                crate::output::human_duration(wait),
                last.map_or("not yet recorded".to_owned(), |s| s.state.to_string()),
            )))
        }
        Err(switchyard::WaitError::Queue(err)) => Err(err),
        Err(err) => Err(Error::InvalidInput(err.to_string())),
    }
}

/// The flags shared by every message of one call, validated once.
struct Template {
    queue: String,
    kind: String,
    id: Option<uuid::Uuid>,
    delay: Option<std::time::Duration>,
    expires_in: Option<std::time::Duration>,
    priority: Option<i16>,
    max_attempts: Option<u32>,
    trace_id: Option<String>,
    headers: Vec<(String, String)>,
    labels: Vec<String>,
    ordering_key: Option<String>,
    unique: Option<Unique>,
}

impl Template {
    fn new(args: &PublishArgs) -> Result<Self> {
        switchyard::QueueName::new(args.queue.clone())
            .map_err(|e| switchyard::ConfigError::new("--queue", e.value, e.expected))?;
        let id = args
            .id
            .as_deref()
            .map(|s| {
                uuid::Uuid::parse_str(s).map_err(|_| {
                    Error::InvalidInput(format!("invalid --id {s:?}: expected a UUID"))
                })
            })
            .transpose()?;
        let mut headers = Vec::new();
        for h in &args.headers {
            let (k, v) = h
                .split_once('=')
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| {
                    Error::InvalidInput(format!("invalid --header {h:?}: expected KEY=VALUE"))
                })?;
            headers.push((k.to_owned(), v.to_owned()));
        }
        let template = Template {
            queue: args.queue.clone(),
            kind: args.kind.clone(),
            id,
            delay: args
                .delay
                .as_deref()
                .map(|d| parse_duration("--delay", d))
                .transpose()?,
            expires_in: args
                .expires_in
                .as_deref()
                .map(|d| parse_duration("--expires-in", d))
                .transpose()?,
            priority: args.priority,
            max_attempts: args.max_attempts,
            trace_id: args.trace_id.clone(),
            headers,
            labels: args.labels.clone(),
            ordering_key: args.ordering_key.clone(),
            unique: unique_of(args)?,
        };
        template.check_flags(args)?;
        Ok(template)
    }

    /// Builds a probe envelope per flag the builder validates, so that a bad value is
    /// reported as an error of its own flag (with the value as given) rather than of
    /// `--payload` or a stdin line, where the whole message's build would report it.
    fn check_flags(&self, args: &PublishArgs) -> Result<()> {
        let probe = |kind: &str| Envelope::builder(self.queue.clone(), kind.to_owned());
        probe(&self.kind)
            .build()
            .map_err(|e| with_context(e, "--kind"))?;
        let flag = |name: &str, given: Option<&String>| match given {
            Some(v) => format!("{name} {v}"),
            None => name.to_owned(),
        };
        if let Some(d) = self.delay {
            probe("probe")
                .delay(d)
                .build()
                .map_err(|e| with_context(e, &flag("--delay", args.delay.as_ref())))?;
        }
        if let Some(d) = self.expires_in {
            probe("probe")
                .expires_in(d)
                .build()
                .map_err(|e| with_context(e, &flag("--expires-in", args.expires_in.as_ref())))?;
        }
        if let Some(m) = self.max_attempts {
            probe("probe")
                .max_attempts(m)
                .build()
                .map_err(|e| with_context(e, &format!("--max-attempts {m}")))?;
        }
        self.labels
            .iter()
            .fold(probe("probe"), |b, l| b.label(l.clone()))
            .build()
            .map_err(|e| with_context(e, "--label"))?;
        if let Some(key) = &self.ordering_key {
            probe("probe")
                .ordering_key(key.clone())
                .build()
                .map_err(|e| with_context(e, "--ordering-key"))?;
        }
        if let Some(unique) = &self.unique {
            let probe = probe("probe").unique(unique.clone());
            match &self.ordering_key {
                Some(key) => probe.ordering_key(key.clone()),
                None => probe,
            }
            .build()
            .map_err(|e| with_context(e, "--unique-key"))?;
        }
        Ok(())
    }

    fn builder(&self) -> EnvelopeBuilder {
        let mut b = Envelope::builder(self.queue.clone(), self.kind.clone());
        if let Some(id) = self.id {
            b = b.id(id);
        }
        if let Some(d) = self.delay {
            b = b.delay(d);
        }
        if let Some(d) = self.expires_in {
            b = b.expires_in(d);
        }
        if let Some(p) = self.priority {
            b = b.priority(p);
        }
        if let Some(m) = self.max_attempts {
            b = b.max_attempts(m);
        }
        if let Some(t) = &self.trace_id {
            b = b.trace_id(t.clone());
        }
        for (k, v) in &self.headers {
            b = b.header(k.clone(), v.clone());
        }
        for label in &self.labels {
            b = b.label(label.clone());
        }
        if let Some(key) = &self.ordering_key {
            b = b.ordering_key(key.clone());
        }
        if let Some(unique) = &self.unique {
            b = b.unique(unique.clone());
        }
        b
    }
}

/// The unique key and its rule from `--unique-key`, `--unique-scope` and
/// `--on-conflict`; an error names the flag, its value and what is accepted.
fn unique_of(args: &PublishArgs) -> Result<Option<Unique>> {
    let Some(key) = &args.unique_key else {
        return Ok(None);
    };
    let mut unique = Unique::new(key.clone());
    let with_duration =
        |flag: &str, given: &str, name: &str| -> Result<Option<std::time::Duration>> {
            match given.split_once(':') {
                Some((n, d)) if n == name => Ok(Some(parse_duration(flag, d)?)),
                _ => Ok(None),
            }
        };
    if let Some(scope) = args.unique_scope.as_deref() {
        unique = match scope {
            "pending" => unique.while_pending(),
            "active" => unique.while_active(),
            other => match with_duration("--unique-scope", other, "done")? {
                Some(period) => unique.until_done_for(period),
                None => {
                    return Err(Error::InvalidInput(format!(
                        "invalid --unique-scope {other:?}: expected pending, active or done:PERIOD (done:5m)"
                    )))
                }
            },
        };
    }
    if let Some(rule) = args.on_conflict.as_deref() {
        unique = if rule == "reject" {
            unique.reject()
        } else if let Some(max_wait) = with_duration("--on-conflict", rule, "replace")? {
            unique.replace(max_wait)
        } else if let Some(ttl) = with_duration("--on-conflict", rule, "throttle")? {
            unique.throttled(ttl)
        } else {
            return Err(Error::InvalidInput(format!(
                "invalid --on-conflict {rule:?}: expected reject, replace:MAX_WAIT (replace:30s) or throttle:TTL (throttle:5m)"
            )));
        };
    }
    Ok(Some(unique))
}

fn with_context(err: Error, what: &str) -> Error {
    match err {
        Error::InvalidInput(msg) => Error::InvalidInput(format!("{what}: {msg}")),
        other => other,
    }
}

/// Reads every stdin line (blank lines skipped) and builds one message per line; the
/// first bad line stops everything before anything is published.
fn read_stdin(template: &Template) -> Result<Vec<Envelope>> {
    let stdin = std::io::stdin();
    let mut out = Vec::new();
    for (n, line) in stdin.lock().lines().enumerate() {
        let line = line.map_err(|e| Error::io(format!("cannot read stdin line {}", n + 1), e))?;
        if line.trim().is_empty() {
            continue;
        }
        let env = template
            .builder()
            .raw_payload(line)
            .build()
            .map_err(|e| with_context(e, &format!("stdin line {}", n + 1)))?;
        out.push(env);
    }
    Ok(out)
}
