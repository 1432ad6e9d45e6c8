use queue_core::Error;

pub(crate) const TRANSPORT: &str = "sqlite";

/// SQLITE_BUSY and SQLITE_LOCKED (primary codes; extended codes keep them in the low byte).
const BUSY_CODES: [i64; 2] = [5, 6];

pub(crate) fn backend(err: sqlx::Error) -> Error {
    let transient = match &err {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|c| c.parse::<i64>().ok())
            .is_some_and(|c| BUSY_CODES.contains(&(c & 0xff))),
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
