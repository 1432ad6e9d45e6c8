//! What the RabbitMQ tests share: the broker to test against.
#![allow(dead_code, unreachable_pub)]

/// The test broker: `SWITCHYARD_TEST_AMQP_URL`, by default the local one.
pub fn url() -> String {
    std::env::var("SWITCHYARD_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// `None` when the broker answers; otherwise why the tests skip. Under `CI=true` an
/// unreachable broker fails the test instead.
pub fn skip_reason() -> Option<String> {
    queue_core::conformance::skip_unless_reachable("RabbitMQ", &url(), 5672)
}
