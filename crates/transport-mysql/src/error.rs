use queue_core::Error;
use sqlx::mysql::MySqlDatabaseError;

pub(crate) const TRANSPORT: &str = "mysql";

/// MySQL error numbers worth retrying at once: a deadlock victim (1213) and a lock wait
/// timeout (1205). The statement or transaction was rolled back and can run again.
pub(crate) fn is_lock_conflict(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .is_some_and(|e| matches!(e.number(), 1213 | 1205)),
        _ => false,
    }
}

/// Server errors that a later retry may get past: the connection broke or the server
/// is going away or restarting (2006, 2013, 1053, 1927, 1040 too many connections).
fn transient_number(n: u16) -> bool {
    matches!(
        n,
        1213 | 1205 | 2006 | 2013 | 1053 | 1927 | 1040 | 1159 | 1161
    )
}

pub(crate) fn backend(err: sqlx::Error) -> Error {
    let transient = match &err {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .is_some_and(|e| transient_number(e.number())),
        _ => false,
    };
    Error::backend(TRANSPORT, transient, err)
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
