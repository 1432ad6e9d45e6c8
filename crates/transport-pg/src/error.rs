use queue_core::Error;

use crate::read_only;

/// The backend's name in errors and logs.
pub(crate) const TRANSPORT: &str = "postgres";

/// SQLSTATEs worth retrying (besides 25006, see `read_only`): the connection broke or the server is restarting
/// (class 08, 57P01-57P03), too many connections (53300), and the losers of a lock
/// conflict (40001 serialization failure, 40P01 deadlock).
fn transient_state(code: &str) -> bool {
    code.starts_with("08")
        || matches!(
            code,
            "57P01" | "57P02" | "57P03" | "53300" | "40001" | "40P01"
        )
}

pub(crate) fn backend(err: sqlx::Error) -> Error {
    let transient = match &err {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => {
            let code = db.code();
            // A server demoted to a standby: drop the old connections and retry.
            if code.as_deref() == Some(read_only::READ_ONLY) {
                read_only::saw_read_only();
                true
            } else {
                code.is_some_and(|c| transient_state(&c))
            }
        }
        // The server closed the connection mid-message.
        sqlx::Error::Protocol(_) => true,
        _ => false,
    };
    Error::backend(TRANSPORT, transient, err)
}

/// Whether the error is a deadlock or serialization failure: the statement can simply run
/// again.
pub(crate) fn is_conflict(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.code().is_some_and(|c| c == "40P01" || c == "40001"))
}

/// Whether the error is a unique violation.
pub(crate) fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.is_unique_violation())
}

/// Shorthand for mapping sqlx results.
pub(crate) trait SqlxResultExt<T> {
    fn backend(self) -> Result<T, Error>;
}

impl<T> SqlxResultExt<T> for Result<T, sqlx::Error> {
    fn backend(self) -> Result<T, Error> {
        self.map_err(backend)
    }
}
