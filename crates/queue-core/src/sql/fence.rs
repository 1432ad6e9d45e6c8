//! Fencing by lease token: what a statement touched, and what lost its lease.

use std::collections::HashSet;

use uuid::Uuid;

use crate::error::{Error, Result};
use crate::reservation::{AckReport, Reservation};

/// Splits a batch into the reservations a statement touched (by id and token) and those
/// whose lease was lost.
pub fn pair_report(reservations: &[Reservation], touched: &HashSet<(String, Uuid)>) -> AckReport {
    let mut report = AckReport::default();
    for r in reservations {
        if touched.contains(&(r.id().to_string(), r.token().0)) {
            report.acked.push(r.id());
        } else {
            report.lost.push(r.id());
        }
    }
    report
}

/// `Ok` when a statement touched the reserved row; [`Error::LeaseLost`] when the lease
/// was gone and nothing changed.
pub fn fenced(touched: bool, reservation: &Reservation) -> Result<()> {
    if touched {
        Ok(())
    } else {
        Err(Error::LeaseLost {
            message_id: reservation.id(),
        })
    }
}

/// The error of a replay of one id that moved nothing: the id is unknown, or a live
/// message has it.
pub fn replay_refused(id: &str, dead_exists: bool) -> Error {
    if dead_exists {
        Error::Conflict(format!(
            "dead letter {id} was not replayed: a live message has the same id"
        ))
    } else {
        Error::NotFound {
            what: "dead letter",
            id: id.to_owned(),
        }
    }
}
