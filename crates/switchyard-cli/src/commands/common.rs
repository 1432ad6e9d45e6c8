//! What several commands share: the `--queue` argument, where the store lives, and
//! RabbitMQ's unknown-queue error.

use switchyard::{BackendKind, Config, QueueName, Result};

/// Where the selected backend lives (password hidden): `DATABASE_URL` or `AMQP_URL`.
pub(crate) fn store_url(config: &Config) -> String {
    store_url_of(config, config.backend)
}

/// Where backend `kind` lives (password hidden).
pub(crate) fn store_url_of(config: &Config, kind: BackendKind) -> String {
    match kind {
        BackendKind::Exec => config.database_url.to_string(),
        BackendKind::RabbitMq => config.amqp_url.to_string(),
    }
}

/// Validates an optional `--queue`.
pub(crate) fn queue_arg(queue: Option<&str>) -> Result<Option<QueueName>> {
    Ok(queue.map(QueueName::new).transpose()?)
}

/// The error for a queue named on the command line that the broker does not have. On
/// RabbitMQ a queue is an object of the broker, so an unknown name is most likely a
/// typo, which a script should not read as "empty". In a SQL table a queue is only a
/// column value, so an unknown name there is indistinguishable from a drained queue.
pub(crate) fn missing_broker_queue(queue: &QueueName) -> switchyard::Error {
    switchyard::ConfigError::new(
        "--queue",
        Some(queue.as_str().to_owned()),
        "a queue that exists on RabbitMQ; the broker has no queue of this name (it is declared by the first publish or worker; nothing was created): check the name",
    )
    .into()
}
