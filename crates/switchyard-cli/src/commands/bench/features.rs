//! What each feature costs when used: the plain drain again with a label filter, with a
//! per-key concurrency limit, and with unique keys (their publish too), each on a fresh
//! queue of the same run.

use std::sync::Arc;

use switchyard::{Envelope, Limit, Result, StatusStore, Unique};

use super::measure::{Drains, With};
use super::workload::queue;

/// The label of the labelled drain.
const LABEL: &str = "bench";
/// The header the limited drain counts by.
const LIMIT_HEADER: &str = "account";
/// The limited drain's keys.
pub(super) const LIMIT_KEYS: usize = 100;
/// How many jobs of a key may run at once in the limited drain.
pub(super) const LIMIT_CONCURRENCY: u32 = 2;

/// The feature drains of one run (`None` where the backend lacks the feature).
#[derive(Debug, Default)]
pub(super) struct FeatureCosts {
    /// The drain with a label filter.
    pub(super) drain_labels_per_s: Option<f64>,
    /// The drain under a per-key concurrency limit.
    pub(super) drain_limited_per_s: Option<f64>,
    /// The batched publish with a unique key each.
    pub(super) enqueue_unique_per_s: Option<f64>,
    /// The drain of those jobs.
    pub(super) drain_unique_per_s: Option<f64>,
}

impl Drains<'_> {
    /// Every feature drain the backend can run.
    pub(super) async fn features(
        &mut self,
        status: Option<&Arc<dyn StatusStore>>,
        n: usize,
    ) -> Result<FeatureCosts> {
        let caps = self.t.capabilities();
        let mut costs = FeatureCosts::default();
        if caps.label_claims {
            costs.drain_labels_per_s = Some(self.labelled(n).await?);
        }
        if let Some(store) = status.and_then(|s| s.limits()) {
            costs.drain_limited_per_s = Some(self.limited(store, n).await?);
        }
        if caps.unique_keys {
            let (publish, drain) = self.unique(n).await?;
            costs.enqueue_unique_per_s = Some(publish);
            costs.drain_unique_per_s = Some(drain);
        }
        Ok(costs)
    }

    /// Every job labelled, and the worker claiming only that label.
    async fn labelled(&mut self, n: usize) -> Result<f64> {
        let q = queue("labels")?;
        let envs = built(n, |i| {
            Envelope::builder(q.as_str(), "noop")
                .payload(&serde_json::json!({ "n": i }))
                .label(LABEL)
                .build()
        })?;
        let ids = self.publish(&q, envs, None).await?.0;
        let with = With {
            labels: vec![LABEL.to_owned()],
            ..With::default()
        };
        self.run(&q, &ids, with).await
    }

    /// Each job counted by one of [`LIMIT_KEYS`] accounts, at most
    /// [`LIMIT_CONCURRENCY`] of an account running at once.
    async fn limited(&mut self, store: Arc<dyn switchyard::LimitStore>, n: usize) -> Result<f64> {
        let q = queue("limited")?;
        let envs = built(n, |i| {
            Envelope::builder(q.as_str(), "noop")
                .payload(&serde_json::json!({ "n": i }))
                .header(LIMIT_HEADER, format!("a{}", i % LIMIT_KEYS))
                .build()
        })?;
        let ids = self.publish(&q, envs, None).await?.0;
        let with = With {
            limits: vec![Limit::per_header(LIMIT_HEADER).concurrency(LIMIT_CONCURRENCY)],
            limit_store: Some(store),
            ..With::default()
        };
        self.run(&q, &ids, with).await
    }

    /// Each job with a unique key of its own (held while it is pending or running): the
    /// batched publish, then the drain.
    async fn unique(&mut self, n: usize) -> Result<(f64, f64)> {
        let q = queue("unique")?;
        let envs = built(n, |i| {
            Envelope::builder(q.as_str(), "noop")
                .payload(&serde_json::json!({ "n": i }))
                .unique(Unique::new(format!("k{i}")))
                .build()
        })?;
        let (ids, publish_per_s) = self.publish(&q, envs, None).await?;
        Ok((publish_per_s, self.run(&q, &ids, With::default()).await?))
    }
}

/// `n` envelopes built by `build`.
fn built(n: usize, build: impl Fn(usize) -> Result<Envelope>) -> Result<Vec<Envelope>> {
    (0..n).map(build).collect()
}
