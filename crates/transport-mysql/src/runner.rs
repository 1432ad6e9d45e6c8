//! The statement runner of the stores written once in queue-core
//! ([`queue_core::sql::runner`]): schedules.

queue_core::sql_runner!(MySqlRunner, sqlx::MySqlPool, sqlx::MySql, binary_text);
