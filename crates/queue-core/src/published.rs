//! What a publish stored: everything, except the messages whose unique key another job
//! held.

use uuid::Uuid;

/// A message that was not stored because another job held its unique key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Duplicate {
    /// The id of the message that was published.
    pub id: Uuid,
    /// The job that holds the key (a done job's, while its key is still held).
    pub existing: Uuid,
    /// Whether that job took this message's payload, headers and due time (a debounce,
    /// [`OnConflict::Replace`](crate::OnConflict::Replace)).
    pub replaced: bool,
}

/// The outcome of a publish: every message was stored (or its id already was) except the
/// [`duplicates`](Self::duplicates).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Published {
    /// Messages not stored because another job held their unique key, in publish order.
    pub duplicates: Vec<Duplicate>,
}

impl Published {
    /// The outcome of a publish that stored everything.
    pub fn all_stored() -> Self {
        Published::default()
    }

    /// Whether the message `id` was a duplicate, and of which job.
    pub fn duplicate_of(&self, id: Uuid) -> Option<&Duplicate> {
        self.duplicates.iter().find(|d| d.id == id)
    }

    /// Adds the outcome of another publish (of other messages).
    pub fn merge(&mut self, other: Published) {
        self.duplicates.extend(other.duplicates);
    }
}
