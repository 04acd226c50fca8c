//! Node commands through the admin API, under
//! `/admin/v1/nodes/{node}/…`:
//!
//! - `GET …/capabilities`: the node's providers (kind, concurrency, routes).
//! - `GET …/transport`: streams in flight on the node, per provider.
//! - `GET …/providers/{provider}/capabilities`: one provider's.
//! - `GET …/providers/{provider}/api/tags` and `…/api/ps`, and
//!   `POST …/api/show` (or `GET` with `?model=`): Ollama's own API, for an
//!   `ollama` provider.
//!
//! The command goes to the node's session like a run; the node's answer
//! comes back as JSON, with the provider's status for provider API calls.

use std::time::Duration;

use bytes::Bytes;
use iop_core::{http::RequestHead, rt::oneshot::oneshot, wire::pb};

use super::respond_error;
use crate::{server::Conn, surface::openai::error, transport::SessionCmd, worker::Worker};

/// How long a node has to answer a command.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// A command route below `/admin/v1/nodes/`.
#[derive(Debug, PartialEq, Eq)]
pub enum CommandRoute<'a> {
    /// `{node}/capabilities` or `{node}/providers/{provider}/capabilities`.
    Capabilities { node: &'a str, provider: Option<&'a str> },
    /// `{node}/transport`.
    Transport { node: &'a str },
    /// `{node}/providers/{provider}/api/{name}`.
    ProviderApi { node: &'a str, provider: &'a str, api: &'a str },
}

impl<'a> CommandRoute<'a> {
    /// The route of `path` (`None`: not a command path).
    pub fn parse(path: &'a str) -> Option<Self> {
        let rest = path.strip_prefix("/admin/v1/nodes/")?;
        let parts: Vec<&str> = rest.split('/').collect();
        Some(match parts.as_slice() {
            [node, "capabilities"] => CommandRoute::Capabilities { node, provider: None },
            [node, "transport"] => CommandRoute::Transport { node },
            [node, "providers", provider, "capabilities"] => {
                CommandRoute::Capabilities { node, provider: Some(provider) }
            }
            [node, "providers", provider, "api", api] => CommandRoute::ProviderApi { node, provider, api },
            _ => return None,
        })
    }

    fn node(&self) -> &'a str {
        match self {
            CommandRoute::Capabilities { node, .. }
            | CommandRoute::Transport { node }
            | CommandRoute::ProviderApi { node, .. } => node,
        }
    }
}

/// Runs one command route; returns whether the connection may be kept.
pub async fn handle(
    worker: &Worker,
    conn: &mut Conn,
    head: &RequestHead,
    route: CommandRoute<'_>,
    body: Bytes,
) -> bool {
    let keep = head.keep_alive;
    let method = if head.method == "HEAD" { "GET" } else { head.method.as_str() };
    let node = route.node();
    let config = worker.config.borrow().clone();
    let Some(entry) = config.node(node) else {
        let msg = format!("no node `{}` is configured", error::clip(node));
        return respond_error(conn, 404, &msg, Some("node_not_found"), &[], keep).await;
    };
    let req = match &route {
        CommandRoute::Capabilities { provider, .. } if method == "GET" => {
            command(pb::NodeCommandKind::Capabilities, provider.unwrap_or_default(), Bytes::new())
        }
        CommandRoute::Transport { .. } if method == "GET" => {
            command(pb::NodeCommandKind::TransportStatus, "", Bytes::new())
        }
        CommandRoute::ProviderApi { provider, api, .. } => {
            let call = match (method, *api) {
                ("GET", "tags" | "ps") => serde_json::json!({"method": "GET", "path": format!("/api/{api}")}),
                ("POST", "show") => {
                    let body: serde_json::Value = match serde_json::from_slice(&body) {
                        Ok(v) => v,
                        Err(e) => {
                            let msg = format!("the body must be JSON, e.g. {{\"model\":\"llama3\"}}: {e}");
                            return respond_error(conn, 400, &msg, Some("invalid_request"), &[], keep).await;
                        }
                    };
                    serde_json::json!({"method": "POST", "path": "/api/show", "body": body})
                }
                ("GET", "show") => match head.query().and_then(|q| query_value(q, "model")) {
                    Some(model) => {
                        serde_json::json!({"method": "POST", "path": "/api/show", "body": {"model": model}})
                    }
                    None => {
                        let msg = "give the model: `?model=<name>`, or POST {\"model\":\"<name>\"}";
                        return respond_error(conn, 400, msg, Some("invalid_request"), &[], keep).await;
                    }
                },
                _ => {
                    let msg = format!("no provider API route {} /api/{}", error::clip(method), error::clip(api));
                    return respond_error(conn, 404, &msg, Some("not_found"), &[], keep).await;
                }
            };
            let payload = Bytes::from(serde_json::to_vec(&call).unwrap_or_default());
            command(pb::NodeCommandKind::ProviderApi, provider, payload)
        }
        _ => {
            return crate::surface::method_not_allowed(conn, head, crate::surface::ALLOW_GET, keep).await.is_ok()
                && keep
        }
    };
    if !req.adapter.is_empty() && entry.provider(&req.adapter).is_none() {
        let msg = format!("node `{node}` has no provider `{}`", error::clip(&req.adapter));
        return respond_error(conn, 404, &msg, Some("provider_not_found"), &[], keep).await;
    }
    let session = worker.routes.borrow().get(node).map(|r| r.session.clone());
    let Some(session) = session else {
        let msg = format!("node `{node}` is not connected");
        return respond_error(conn, 503, &msg, Some("node_not_ready"), &[("retry-after", "1")], keep).await;
    };
    let (reply, rx) = oneshot();
    if session.try_send(SessionCmd::Command { req, reply }).is_err() {
        let msg = format!("node `{node}` is busy");
        return respond_error(conn, 503, &msg, Some("node_busy"), &[("retry-after", "1")], keep).await;
    }
    let resp = match monoio::time::timeout(COMMAND_TIMEOUT, rx).await {
        Ok(Some(resp)) => resp,
        Ok(None) => {
            let msg = format!("node `{node}` went away before answering");
            return respond_error(conn, 502, &msg, Some("node_disconnected"), &[], keep).await;
        }
        Err(_) => {
            let msg = format!("node `{node}` did not answer within {} s", COMMAND_TIMEOUT.as_secs());
            return respond_error(conn, 504, &msg, Some("node_timeout"), &[], keep).await;
        }
    };
    let status = u16::try_from(resp.status).ok().filter(|s| (200..=599).contains(s));
    if resp.ok {
        let headers = [("cache-control", "no-store")];
        conn.respond(status.unwrap_or(200), "application/json", &headers, &resp.result_json, keep).await.is_ok() && keep
    } else {
        respond_error(conn, status.unwrap_or(502), &resp.error, Some("command_failed"), &[], keep).await
    }
}

fn command(kind: pb::NodeCommandKind, adapter: &str, payload_json: Bytes) -> pb::NodeCommandRequest {
    pb::NodeCommandRequest { kind: kind as i32, adapter: adapter.to_owned(), target: String::new(), payload_json }
}

/// The value of `key` in a query string (no percent-decoding beyond `+`
/// and `%xx` of ASCII, enough for model names).
fn query_value(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            CommandRoute::parse("/admin/v1/nodes/n1/capabilities"),
            Some(CommandRoute::Capabilities { node: "n1", provider: None })
        );
        assert_eq!(CommandRoute::parse("/admin/v1/nodes/n1/transport"), Some(CommandRoute::Transport { node: "n1" }));
        assert_eq!(
            CommandRoute::parse("/admin/v1/nodes/n1/providers/ol/api/tags"),
            Some(CommandRoute::ProviderApi { node: "n1", provider: "ol", api: "tags" })
        );
        assert_eq!(
            CommandRoute::parse("/admin/v1/nodes/n1/providers/ol/capabilities"),
            Some(CommandRoute::Capabilities { node: "n1", provider: Some("ol") })
        );
        assert_eq!(CommandRoute::parse("/admin/v1/nodes"), None);
        assert_eq!(CommandRoute::parse("/admin/v1/nodes/n1/providers/ol/api/tags/x"), None);
    }

    #[test]
    fn query_values() {
        assert_eq!(query_value("a=1&model=llama3%3A8b", "model").as_deref(), Some("llama3:8b"));
        assert_eq!(query_value("model=a+b%zz%", "model").as_deref(), Some("a b%zz%"));
        assert_eq!(query_value("x=1", "model"), None);
    }
}
