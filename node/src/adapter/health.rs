//! The exact-target health probe a stall terminal is joined with: one
//! bounded GET of the provider's model list, read for the target. It never
//! resets a watchdog, lifts a fence or allows a retry by itself.

use std::time::Duration;

use iop_core::{config::UpstreamUrl, liveness::ProviderHealth};
use serde_json::Value;

use crate::upstream::{Request, UpstreamClient};

/// The longest a probe may take; past it the provider counts as not answering.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest model list read.
const MAX_LIST_BYTES: usize = 1024 * 1024;

/// What a probe needs of an adapter.
pub(super) struct Probe<'a> {
    pub client: &'a UpstreamClient,
    pub url: &'a UpstreamUrl,
    /// TLS for an https provider.
    pub tls: Option<&'a iop_core::net::tls::ClientTls>,
    /// `Bearer …`, when the provider wants one.
    pub authorization: Option<&'a str>,
    /// The list's path under the base URL (`/models`, `/api/tags`).
    pub list: &'a str,
    pub provider: &'a str,
}

impl Probe<'_> {
    /// Asks whether the provider answers and lists `target`.
    pub async fn run(&self, target: &str) -> ProviderHealth {
        let path = format!("{}{}", self.url.path_prefix.trim_end_matches('/'), self.list);
        let mut headers: Vec<(&str, &[u8])> = vec![("accept", b"application/json")];
        if let Some(auth) = self.authorization {
            headers.push(("authorization", auth.as_bytes()));
        }
        let req = Request {
            method: "GET",
            host: &self.url.host,
            port: self.url.port,
            target: &path,
            headers: &headers,
            body: &[],
            tls: self.tls,
        };
        let call = async {
            // Not reachable, or the connection broke: not answering.
            // Boxed: a stall's probe is part of every run's future.
            let sent = Box::pin(super::send_upstream(self.client, &req, self.provider, "health-probe")).await;
            let Ok(mut resp) = sent else {
                return ProviderHealth::Unavailable;
            };
            let status = resp.status();
            match resp.read_to_end(MAX_LIST_BYTES).await {
                Ok((body, false)) => classify(status, &body, target),
                Ok((_, true)) => ProviderHealth::Unknown,
                Err(_) => ProviderHealth::Unavailable,
            }
        };
        iop_core::rt::time::timeout(PROBE_TIMEOUT, call).await.unwrap_or(ProviderHealth::Unavailable)
    }
}

/// Reads a model-list answer for `target`.
fn classify(status: u16, body: &[u8], target: &str) -> ProviderHealth {
    if status == 503 && mentions_loading(body) {
        return ProviderHealth::Starting;
    }
    if status >= 500 {
        return ProviderHealth::Unavailable;
    }
    if !(200..=299).contains(&status) {
        // Refused (auth, no such route): cannot tell.
        return ProviderHealth::Unknown;
    }
    let Ok(list) = serde_json::from_slice::<Value>(body) else { return ProviderHealth::Unknown };
    // OpenAI's `data[].id`; Ollama's `models[].name` / `.model`.
    let entries = list.get("data").or_else(|| list.get("models")).and_then(Value::as_array);
    let Some(entries) = entries else { return ProviderHealth::Unknown };
    let names = entries.iter().flat_map(|e| ["id", "name", "model"].into_iter().filter_map(|k| e.get(k)?.as_str()));
    let tagged = format!("{target}:latest");
    if names.into_iter().any(|n| n == target || n == tagged) {
        ProviderHealth::Available
    } else {
        // Answering, but not serving the target.
        ProviderHealth::Unavailable
    }
}

/// Whether a 503's body says the server is loading (llama.cpp: `Loading
/// model`; others word it alike).
fn mentions_loading(body: &[u8]) -> bool {
    let head = &body[..body.len().min(4096)];
    memchr::memmem::find(&head.to_ascii_lowercase(), b"loading").is_some()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_read_for_the_exact_target() {
        let openai = br#"{"object":"list","data":[{"id":"m1"},{"id":"m2"}]}"#;
        assert_eq!(classify(200, openai, "m2"), ProviderHealth::Available);
        assert_eq!(classify(200, openai, "m3"), ProviderHealth::Unavailable);
        let ollama = br#"{"models":[{"name":"llama3.2:latest","model":"llama3.2:latest"}]}"#;
        assert_eq!(classify(200, ollama, "llama3.2"), ProviderHealth::Available);
        let llama_cpp = br#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#;
        assert_eq!(classify(503, llama_cpp, "m1"), ProviderHealth::Starting);
        assert_eq!(classify(503, b"overloaded", "m1"), ProviderHealth::Unavailable);
        assert_eq!(classify(500, b"loading", "m1"), ProviderHealth::Unavailable);
        assert_eq!(classify(401, b"{}", "m1"), ProviderHealth::Unknown);
        assert_eq!(classify(200, b"not json", "m1"), ProviderHealth::Unknown);
        assert_eq!(classify(200, br#"{"x":1}"#, "m1"), ProviderHealth::Unknown);
    }
}
