//! The transport's name in its errors, the errors every other module builds, and the
//! one way it takes a lock. The lowest module: it imports no other.

use std::sync::Mutex;

use queue_core::{Error, Reservation};

pub(crate) const TRANSPORT: &str = "amqp";

pub(crate) fn closed_error() -> Error {
    Error::backend(TRANSPORT, false, "the RabbitMQ transport was closed")
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A refused queue declaration, most often a queue that exists with other arguments.
pub(crate) fn declare_error(queue: &str, err: lapin::Error) -> Error {
    Error::backend(
        TRANSPORT,
        false,
        format!("declaring queue {queue:?} failed (does it exist with other arguments, say as a classic queue where a quorum queue is configured?): {err}"),
    )
}

/// An error's own message, without the transport's name in front.
pub(crate) fn source_text(err: &Error) -> String {
    match err {
        Error::Backend { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}

pub(crate) fn broker(err: lapin::Error) -> Error {
    // A closed channel or connection may recover; a refused declaration will not. The
    // broker's INTERNAL_ERROR closes the connection over a fault of its own (such as a
    // consume of a quorum queue whose leader is not elected yet), and CONNECTION_FORCED
    // as its node stops (a rolling restart) or an operator closes it: the next
    // connection may work, so a publish cut off by either is made again.
    let transient = match err.kind() {
        lapin::ErrorKind::ProtocolError(e) => matches!(
            e.kind(),
            lapin::protocol::AMQPErrorKind::Hard(
                lapin::protocol::AMQPHardError::INTERNALERROR
                    | lapin::protocol::AMQPHardError::CONNECTIONFORCED
            )
        ),
        _ => true,
    };
    Error::backend(TRANSPORT, transient, err)
}

/// Whether the broker answered NOT_FOUND (a passive declaration of a queue that does not
/// exist): any other error, a connection the broker closed included, is not an answer
/// about the queue.
pub(crate) fn not_found(err: &lapin::Error) -> bool {
    matches!(
        err.kind(),
        lapin::ErrorKind::ProtocolError(e) if matches!(
            e.kind(),
            lapin::protocol::AMQPErrorKind::Soft(lapin::protocol::AMQPSoftError::NOTFOUND)
        )
    )
}

pub(crate) fn lost(r: &Reservation) -> Error {
    Error::LeaseLost { message_id: r.id() }
}
