//! Cases of bad input and bad data: over-limit payloads, malformed rows, text no store
//! takes as it is, envelopes naming another queue, invalid identifiers.

use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use super::case_support::{applies, fresh_queue, message, open, reserve_within, stats_of};
use super::harness::{Harness, OpenOptions};
use crate::{reason, Envelope, Error, QueueName, Result, TransportExt};

/// A payload over the backend's limit is rejected with a clear error, and a batch that
/// holds one stores nothing.
pub async fn over_limit_payload_is_rejected_and_nothing_is_stored(
    h: Arc<dyn Harness>,
) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    let limit = t.capabilities().max_payload_bytes;
    let payload = format!("\"{}\"", "x".repeat(limit + 1));
    let big = Envelope::builder(q.as_str(), "too-big")
        .raw_payload(payload)
        .build()?;
    let err = t
        .publish(big.clone())
        .await
        .expect_err("an over-limit payload was accepted");
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(&big.id.to_string()) && text.contains(&limit.to_string()),
        "{text}"
    );
    let small = message(&q, "small");
    assert!(t.publish_batch(vec![small, big]).await.is_err());
    let s = stats_of(t.as_ref(), &q).await?;
    assert_eq!(s.ready, 0, "part of a rejected batch was stored");
    Ok(())
}

/// A stored row that is not a valid v1 envelope is quarantined as `malformed` and the
/// next message is still served by the same reserve.
pub async fn malformed_row_is_quarantined_and_the_next_message_served(
    h: Arc<dyn Harness>,
) -> Result<()> {
    let store = h.store().await?;
    let options = OpenOptions::default();
    let t = store.open(options.clone()).await?;
    let q = fresh_queue();
    let future_id = Uuid::now_v7().to_string();
    let future = format!(
        "{{\"v\":2,\"id\":\"{future_id}\",\"queue\":\"{q}\",\"kind\":\"k\",\"payload\":null}}"
    );
    store
        .insert_raw(
            &options.table,
            q.as_str(),
            "not-a-uuid-1",
            "this is {not json",
        )
        .await?;
    store
        .insert_raw(&options.table, q.as_str(), &future_id, &future)
        .await?;
    let good = message(&q, "good");
    t.publish(good.clone()).await?;

    let r = t.reserve(&q).await?.expect("the good message is served");
    assert_eq!(r.id(), good.id);
    t.ack(&r).await?;
    let dead = t.dead_list(Some(&q), 10).await?;
    assert_eq!(dead.len(), 2, "{dead:?}");
    for d in &dead {
        assert_eq!(d.reason, reason::MALFORMED);
        assert!(d.envelope.is_none());
        assert!(d.last_error.as_deref().is_some_and(|e| !e.is_empty()));
    }
    let garbage = dead
        .iter()
        .find(|d| d.id == "not-a-uuid-1")
        .expect("the garbage row");
    assert_eq!(
        garbage.raw.as_deref(),
        Some("this is {not json"),
        "the raw body was lost"
    );
    let v2 = dead.iter().find(|d| d.id == future_id).expect("the v2 row");
    assert!(
        v2.last_error
            .as_deref()
            .is_some_and(|e| e.contains("version 2")),
        "{v2:?}"
    );
    assert!(t.reserve(&q).await?.is_none());
    Ok(())
}

/// Text from outside (a NUL, a control character, an error of any length) is stored on
/// every backend: a publish keeps the envelope's fields as published, and a release or
/// dead letter stores the error NUL-free and bounded rather than failing (which would
/// turn each retry into a lost lease).
pub async fn outside_text_with_nuls_and_any_length_is_stored(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    let payload = "{\"s\":\"a\\u0000b\",\"c\":\"\\u001b[31m\"}";
    let mut env = Envelope::builder(q.as_str(), "k")
        .raw_payload(payload)
        .header("ke\0y", "va\0lue")
        .trace_id("tr\0ace")
        .build()?;
    // Not through the builder, which refuses control characters: an envelope decoded
    // from elsewhere (a relay, a move) can carry them.
    env.kind = format!("ki\0nd{}", "k".repeat(300));
    env.last_error = Some("an earlier\0failure".into());
    t.publish(env.clone()).await?;
    let r = reserve_within(t.as_ref(), &q, Duration::from_secs(5))
        .await?
        .expect("the message is served");
    assert_eq!(r.envelope.payload.get(), payload);
    assert_eq!(r.envelope.kind, env.kind);
    assert_eq!(r.envelope.headers, env.headers);
    assert_eq!(r.envelope.trace_id, env.trace_id);
    assert!(
        r.envelope
            .last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("an earlier") && e.ends_with("failure")),
        "{:?}",
        r.envelope.last_error
    );

    let cause = "\0boom \u{1}\u{1b}[0m \u{fffd} \u{1F600} the end";
    let long = format!("{}{cause}", "x".repeat(20_000));
    t.release(&r, Duration::ZERO, Some(&long)).await?;
    let r = reserve_within(t.as_ref(), &q, Duration::from_secs(5))
        .await?
        .expect("released at once, not after a lease");
    let kept = r.envelope.last_error.clone().unwrap_or_default();
    assert!(
        kept.len() <= crate::text::ERROR_KEPT && kept.ends_with(&cause.replace('\0', "\u{fffd}")),
        "{} bytes: {}",
        kept.len(),
        kept.get(kept.len().saturating_sub(80)..)
            .unwrap_or_default()
    );

    let why = format!("custom\0{}", "r".repeat(100));
    t.dead_letter(&r, &why, Some("fatal\0error")).await?;
    let dead = t.dead_list(Some(&q), 10).await?;
    assert_eq!(dead.len(), 1, "{dead:?}");
    let d = &dead[0];
    assert!(
        d.reason.starts_with("custom\u{fffd}r") && d.reason.len() <= crate::text::REASON_KEPT,
        "{:?}",
        d.reason
    );
    assert_eq!(d.last_error.as_deref(), Some("fatal\u{fffd}error"));
    let kept = d.envelope.as_ref().expect("the envelope is kept");
    assert_eq!(kept.payload.get(), payload);
    assert_eq!(kept.headers, env.headers);
    Ok(())
}

/// A valid envelope that names another queue than the one it was stored in or delivered
/// from never wedges that queue: it is delivered there or quarantined there (reason
/// `malformed`, saying so), never left unsettled, and the next message is served.
pub async fn an_envelope_naming_another_queue_never_wedges_its_queue(
    h: Arc<dyn Harness>,
) -> Result<()> {
    let store = h.store().await?;
    let options = OpenOptions::default();
    let t = store.open(options.clone()).await?;
    let (q, other) = (fresh_queue(), fresh_queue());
    let stray = message(&other, "stray");
    let body = stray.to_json();
    store
        .insert_raw(&options.table, q.as_str(), &stray.id.to_string(), &body)
        .await?;
    let good = message(&q, "good");
    t.publish(good.clone()).await?;

    let mut served = Vec::new();
    while let Some(r) = reserve_within(t.as_ref(), &q, Duration::from_secs(2)).await? {
        served.push(r.id());
        t.ack(&r).await?;
    }
    assert!(served.contains(&good.id), "{served:?}");
    if !served.contains(&stray.id) {
        let dead = t.dead_list(Some(&q), 10).await?;
        let d = dead
            .iter()
            .find(|d| d.id == stray.id.to_string())
            .unwrap_or_else(|| panic!("the stray message is neither served nor dead: {dead:?}"));
        assert_eq!(d.reason, reason::MALFORMED);
        assert!(
            d.last_error
                .as_deref()
                .is_some_and(|e| e.contains(other.as_str()) && e.contains(q.as_str())),
            "{d:?}"
        );
    }
    let s = stats_of(t.as_ref(), &q).await?;
    assert_eq!((s.ready, s.delayed, s.reserved), (0, 0, 0), "{s:?}");
    Ok(())
}

/// Bad table names are configuration errors raised before any connection or SQL.
pub async fn invalid_identifiers_are_rejected_before_any_sql_runs(
    h: Arc<dyn Harness>,
) -> Result<()> {
    let store = h.store().await?;
    // Only stores of tables (and schemas) have such names to check.
    let t = store.open(OpenOptions::default()).await?;
    if !applies(
        t.as_ref(),
        "table_isolation",
        t.capabilities().table_isolation,
    ) {
        return Ok(());
    }
    let long = "t".repeat(64);
    for bad in [
        "",
        "1jobs",
        "jobs;drop table users",
        "jobs\"",
        "a b",
        "jobs-x",
        long.as_str(),
    ] {
        let options = OpenOptions {
            table: bad.into(),
            ..OpenOptions::default()
        };
        match store.open_unreachable(options.clone()).await {
            Err(Error::Config(e)) => assert!(
                e.to_string().to_lowercase().contains("table"),
                "the error does not name the table setting: {e}"
            ),
            other => panic!("table {bad:?} against an unreachable store gave {other:?}"),
        }
        assert!(
            matches!(store.open(options).await, Err(Error::Config(_))),
            "table {bad:?} was accepted"
        );
    }
    for bad in ["", "a b", "q/1", "q;drop"] {
        assert!(QueueName::new(bad).is_err(), "queue {bad:?} was accepted");
    }
    Ok(())
}
