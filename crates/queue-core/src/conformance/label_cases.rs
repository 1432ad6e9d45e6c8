//! Cases of labels: what a claim that selects labels takes, and what it never takes.

use std::sync::Arc;

use super::case_support::{applies, fresh_queue, message, open};
use super::harness::Harness;
use crate::{Claim, DeadSelection, Envelope, Error, QueueName, Result, TransportExt};

fn labelled(q: &QueueName, kind: &str, labels: &[&str]) -> Envelope {
    labels
        .iter()
        .fold(Envelope::builder(q.as_str(), kind), |b, l| b.label(*l))
        .build()
        .expect("a valid envelope")
}

fn labels(names: &[&str]) -> Vec<String> {
    names.iter().map(|l| (*l).to_owned()).collect()
}

/// A claim that names labels takes only messages carrying one of them; one that names
/// none takes what is left. Order is not asserted: a router splits one queue over two
/// stores and claims from each in turn. Labels come back on the envelope, sorted.
/// A backend that cannot select refuses the filter rather than ignore it.
pub async fn claims_select_by_label(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    let red = labelled(&q, "red", &["red"]);
    let blue = labelled(&q, "blue", &["blue"]);
    let both = labelled(&q, "both", &["red", "blue", "red"]);
    let plain = message(&q, "plain");
    t.publish_batch(vec![red.clone(), blue.clone(), both.clone(), plain.clone()])
        .await?;
    assert_eq!(both.labels, ["blue", "red"], "labels are sorted, once each");
    let red_filter = labels(&["red"]);
    if !applies(t.as_ref(), "label_claims", t.capabilities().label_claims) {
        let refused = t
            .claim(&q, Claim::reserve(10).with_labels(&red_filter))
            .await;
        assert!(
            matches!(refused, Err(Error::NotSupported(_))),
            "a label filter was not refused: {refused:?}"
        );
        let got = t.reserve_batch(&q, 10).await?;
        let back = got
            .iter()
            .find(|r| r.id() == both.id)
            .expect("the labelled message");
        assert_eq!(back.envelope.labels, ["blue", "red"]);
        return t.ack_batch(&got).await.map(|_| ());
    }
    let reds = t
        .claim(&q, Claim::reserve(10).with_labels(&red_filter))
        .await?;
    let mut ids: Vec<_> = reds.iter().map(|r| r.id()).collect();
    ids.sort();
    let mut want = [red.id, both.id];
    want.sort();
    assert_eq!(ids, want, "a red claim took {ids:?}");
    let back = reds
        .iter()
        .find(|r| r.id() == both.id)
        .expect("the message with both labels");
    assert_eq!(back.envelope.labels, ["blue", "red"]);
    let none_left = t
        .claim(&q, Claim::reserve(10).with_labels(&red_filter))
        .await?;
    assert!(
        none_left.is_empty(),
        "a red claim took a message twice or a blue one"
    );
    // Any of several labels; an unknown label selects nothing.
    let unknown = labels(&["green"]);
    assert!(t
        .claim(&q, Claim::reserve(10).with_labels(&unknown))
        .await?
        .is_empty());
    let either = labels(&["green", "blue"]);
    let blues = t.claim(&q, Claim::reserve(10).with_labels(&either)).await?;
    assert_eq!(blues.iter().map(|r| r.id()).collect::<Vec<_>>(), [blue.id]);
    let rest = t.reserve_batch(&q, 10).await?;
    assert_eq!(rest.iter().map(|r| r.id()).collect::<Vec<_>>(), [plain.id]);
    t.ack_batch(&reds).await?;
    t.ack_batch(&blues).await?;
    t.ack_batch(&rest).await?;
    Ok(())
}

/// A labelled message keeps its labels through a retry, the dead-letter store and a
/// replay: a worker that selects them still gets it.
pub async fn labels_survive_retry_dead_letter_and_replay(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    if !applies(t.as_ref(), "label_claims", t.capabilities().label_claims) {
        return Ok(());
    }
    let q = fresh_queue();
    let red = labelled(&q, "red", &["red"]);
    t.publish(red.clone()).await?;
    let filter = labels(&["red"]);
    let claim = || Claim::reserve(1).with_labels(&filter);
    let first = t.claim(&q, claim()).await?.pop().expect("the red message");
    t.release(&first, std::time::Duration::ZERO, Some("again"))
        .await?;
    let second = t
        .claim(&q, claim())
        .await?
        .pop()
        .expect("released, still red");
    t.dead_letter(&second, "max_attempts", Some("gave up"))
        .await?;
    t.dead_replay(Some(&q), &DeadSelection::Id(red.id.to_string()))
        .await?;
    let third = t
        .claim(&q, claim())
        .await?
        .pop()
        .expect("replayed, still red");
    assert_eq!(third.id(), red.id);
    assert_eq!(third.envelope.labels, ["red"]);
    t.ack(&third).await
}

/// A label outside the accepted form is refused by the builder, by publish (nothing of
/// the batch stored) and by a claim, each naming the label and what is accepted.
pub async fn invalid_labels_are_refused(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    let err = Envelope::builder(q.as_str(), "bad")
        .label("a,b")
        .build()
        .expect_err("a comma in a label");
    assert!(err.to_string().contains("invalid label \"a,b\""), "{err}");
    let mut bad = message(&q, "bad");
    bad.labels = vec!["with space".into()];
    let good = message(&q, "good");
    let refused = t.publish_batch(vec![good, bad]).await;
    match refused {
        Err(Error::InvalidInput(why)) => assert!(why.contains("expected 1 to 64"), "{why}"),
        other => panic!("a bad label was not refused: {other:?}"),
    }
    assert!(
        t.reserve(&q).await?.is_none(),
        "part of a refused batch was stored"
    );
    let filter = labels(&["no/slash"]);
    let refused = t.claim(&q, Claim::reserve(1).with_labels(&filter)).await;
    assert!(
        matches!(
            refused,
            Err(Error::InvalidInput(_) | Error::NotSupported(_))
        ),
        "a bad label filter was accepted: {refused:?}"
    );
    Ok(())
}
