//! Conversions between rows and values: envelopes to store, dead-letter rows, a
//! reservation's row, attempt counts.

use chrono::{DateTime, Utc};

use crate::dead_letters::{DeadLetter, DeadSelection};
use crate::envelope::Envelope;
use crate::error::Result;
use crate::reservation::Reservation;
use crate::time_units::micros;

/// What a SQL dead-letter row holds for a moved dead letter: the stored text (the
/// envelope, or the raw text of a malformed one), the priority, the expiry and the labels
/// column.
pub fn dead_row(letter: &DeadLetter) -> (String, i16, Option<DateTime<Utc>>, Option<String>) {
    match &letter.envelope {
        Some(env) => (
            env.to_json(),
            env.priority,
            env.expires_at,
            crate::labels::column(&env.labels),
        ),
        None => (letter.raw.clone().unwrap_or_default(), 0, None, None),
    }
}

/// Checks an envelope's stored fields and puts its labels in their stored order (the JSON
/// is written after this); returns the labels column (`,a,b,`, or `None`).
pub fn labels_column(env: &mut Envelope) -> Result<Option<String>> {
    env.normalize_for_store()?;
    Ok(crate::labels::column(&env.labels))
}

/// The row a SQL transport's reservation came from: its receipt's tag is the row's
/// `seq` (the claim sets it); -1, which matches no row, if it is out of range.
pub fn row_seq(reservation: &Reservation) -> i64 {
    i64::try_from(reservation.receipt.tag()).unwrap_or(-1)
}

/// The id of a dead-letter selection, and its age cutoff in microseconds.
pub fn selection_parts(selection: &DeadSelection) -> Result<(Option<String>, Option<i64>)> {
    Ok(match selection {
        DeadSelection::Id(id) => (Some(id.clone()), None),
        DeadSelection::All => (None, None),
        DeadSelection::OlderThan(age) => (None, Some(micros(*age))),
    })
}

/// An attempts column as a count (negative reads as 0).
pub fn attempts_u32(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

/// An envelope ready to store: its JSON and its labels column.
#[derive(Debug)]
pub struct Encoded {
    /// The envelope, its labels checked.
    pub env: Envelope,
    /// Its JSON.
    pub json: String,
    /// Its labels column.
    pub labels: Option<String>,
}

/// Each envelope with its JSON, every size and label checked before anything is stored
/// (so a batch with one oversized envelope stores nothing).
pub fn encoded(envelopes: Vec<Envelope>, max_payload_bytes: usize) -> Result<Vec<Encoded>> {
    let mut rows = Vec::with_capacity(envelopes.len());
    for mut env in envelopes {
        let labels = labels_column(&mut env)?;
        let json = env.to_json();
        if json.len() > max_payload_bytes {
            env.check_size(max_payload_bytes)?;
        }
        rows.push(Encoded { env, json, labels });
    }
    Ok(rows)
}
