//! Posting a notice to a Slack-compatible incoming webhook (`{"text": …}`), which
//! e-mail and chat relays accept too.

use std::time::Duration;

use switchyard::{Error, Result};

use super::incidents::Notice;

/// How long one post may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A webhook. Its URL is a secret (Slack's carry their token in the path): errors and
/// logs name its host only.
pub(crate) struct Webhook {
    client: reqwest::Client,
    url: reqwest::Url,
}

impl Webhook {
    /// Checks `url` (http or https) and makes the client.
    pub(crate) fn new(url: &str) -> Result<Self> {
        let refused = || {
            switchyard::ConfigError::new(
                "--alert-webhook",
                None,
                "an http:// or https:// URL, such as a Slack incoming webhook",
            )
        };
        let url = reqwest::Url::parse(url).map_err(|_| refused())?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(refused().into());
        }
        let client = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .build()
            .map_err(|e| Error::InvalidInput(format!("cannot make the webhook client: {e}")))?;
        Ok(Webhook { client, url })
    }

    /// The host it posts to, for logs.
    pub(crate) fn host(&self) -> &str {
        self.url.host_str().unwrap_or("?")
    }

    /// Posts `notice`; an answer other than 2xx is an error.
    pub(crate) async fn post(&self, notice: &Notice) -> Result<()> {
        let body = serde_json::json!({ "text": text(notice) });
        let answer = self
            .client
            .post(self.url.clone())
            .json(&body)
            .send()
            .await
            .map_err(|e| {
                Error::io(
                    format!("posting to the webhook at {}", self.host()),
                    std::io::Error::other(e.without_url()),
                )
            })?;
        let status = answer.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(Error::InvalidInput(format!(
                "the webhook at {} answered {status}",
                self.host()
            )))
        }
    }
}

/// The message: what, where, and whether it opened or resolved.
pub(crate) fn text(notice: &Notice) -> String {
    let (mark, state) = if notice.firing {
        (":rotating_light:", "FIRING")
    } else {
        (":white_check_mark:", "RESOLVED")
    };
    format!(
        "{mark} switchyard {state}: {} on {}: {}",
        notice.rule.name(),
        notice.queue,
        notice.text
    )
}
