//! The statement runner of the stores written once in queue-core
//! ([`queue_core::sql::runner`]): schedules.

queue_core::sql_runner!(SqliteRunner, sqlx::SqlitePool, sqlx::Sqlite);
