//! Incidents open and close: each is announced once when it opens and once when it
//! resolves, however many readings it lasts.

use std::collections::BTreeMap;

use super::rules::{Key, Rule};

/// An announcement for the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Notice {
    pub(crate) rule: Rule,
    pub(crate) queue: String,
    pub(crate) firing: bool,
    pub(crate) text: String,
}

/// The incidents open now.
#[derive(Debug, Default)]
pub(crate) struct Incidents {
    open: BTreeMap<Key, String>,
}

impl Incidents {
    /// What changed since the last reading: newly open incidents, and resolved ones.
    pub(crate) fn update(&mut self, now: BTreeMap<Key, String>) -> Vec<Notice> {
        let mut notices = Vec::new();
        for (key, text) in &now {
            if !self.open.contains_key(key) {
                notices.push(Notice {
                    rule: key.0,
                    queue: key.1.clone(),
                    firing: true,
                    text: text.clone(),
                });
            }
        }
        for ((rule, queue), text) in &self.open {
            if !now.contains_key(&(*rule, queue.clone())) {
                notices.push(Notice {
                    rule: *rule,
                    queue: queue.clone(),
                    firing: false,
                    text: format!("resolved: {text}"),
                });
            }
        }
        self.open = now;
        notices
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(keys: &[(Rule, &str)]) -> BTreeMap<Key, String> {
        keys.iter()
            .map(|(r, q)| ((*r, (*q).to_owned()), format!("{} on {q}", r.name())))
            .collect()
    }

    #[test]
    fn an_incident_is_announced_once_when_it_opens_and_once_when_it_resolves() {
        let mut incidents = Incidents::default();
        let fired = incidents.update(reading(&[(Rule::FailureRate, "a")]));
        assert_eq!(fired.len(), 1);
        assert!(fired[0].firing);
        assert!(incidents
            .update(reading(&[(Rule::FailureRate, "a")]))
            .is_empty());
        let both = incidents.update(reading(&[(Rule::NoWorkers, "b")]));
        assert_eq!(both.len(), 2, "{both:?}");
        assert!(both.iter().any(|n| n.firing && n.queue == "b"));
        assert!(both
            .iter()
            .any(|n| !n.firing && n.queue == "a" && n.text.starts_with("resolved: ")));
        assert_eq!(incidents.update(BTreeMap::new()).len(), 1);
        assert!(incidents.update(BTreeMap::new()).is_empty());
    }
}
