//! Node commands through the admin API, under
//! `/admin/v1/nodes/{node}/…`:
//!
//! - `GET …/capabilities`: the node's providers (kind, concurrency, routes).
//! - `GET …/transport`: streams in flight on the node, per provider.
//! - `GET …/providers/{provider}/capabilities`: one provider's.
//! - `GET …/providers/{provider}/api/tags` and `…/api/ps`, and
//!   `POST …/api/show` (or `GET` with `?model=`): Ollama's own API, for an
//!   `ollama` provider.
//! - `GET …/runs?limit=&status=`: the node's recent runs and tunnels from
//!   its run store, newest first; `GET …/runs/{run_id}`: one of them.
//!
//! The command goes to the node's session like a run; the node's answer
//! comes back as JSON, with the provider's status for provider API calls.

use std::time::Duration;

use bytes::Bytes;
use iop_core::{
    http::RequestHead,
    rt::{mailbox, oneshot::oneshot},
    wire::pb,
};

use super::respond_error;
use crate::{ctx::Ctx, link::SessionCmd, server::Conn, surface::openai::error};

/// How long a node has to answer a command.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// The most rows one runs answer may ask for (the node's bound too).
pub const MAX_RUNS_LIMIT: u32 = 500;
/// A run's status, as the node's store names them.
pub const RUN_STATUSES: [&str; 3] = ["complete", "error", "cancelled"];
/// The largest run store answer relayed: 500 rows of ids, numbers and
/// closed labels take well under this; past it the node is not answering
/// what it was asked.
const MAX_RUNS_ANSWER_BYTES: usize = 1 << 20;
/// The longest run id asked for (the edge's ids are far shorter).
const MAX_RUN_ID_BYTES: usize = 128;

/// A command route below `/admin/v1/nodes/`.
#[derive(Debug, PartialEq, Eq)]
pub enum CommandRoute<'a> {
    /// `{node}/capabilities` or `{node}/providers/{provider}/capabilities`.
    Capabilities { node: &'a str, provider: Option<&'a str> },
    /// `{node}/transport`.
    Transport { node: &'a str },
    /// `{node}/providers/{provider}/api/{name}`.
    ProviderApi { node: &'a str, provider: &'a str, api: &'a str },
    /// `POST {node}/links/{index}/close`: closes one link on the edge (the
    /// node reconnects it into the same generation).
    CloseLink { node: &'a str, index: &'a str },
    /// `{node}/runs`: the node's recent runs.
    Runs { node: &'a str },
    /// `{node}/runs/{run_id}`: one run.
    Run { node: &'a str, run_id: &'a str },
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
            [node, "links", index, "close"] => CommandRoute::CloseLink { node, index },
            [node, "runs"] => CommandRoute::Runs { node },
            [node, "runs", run_id] => CommandRoute::Run { node, run_id },
            _ => return None,
        })
    }

    fn node(&self) -> &'a str {
        match self {
            CommandRoute::Capabilities { node, .. }
            | CommandRoute::Transport { node }
            | CommandRoute::ProviderApi { node, .. }
            | CommandRoute::CloseLink { node, .. }
            | CommandRoute::Runs { node }
            | CommandRoute::Run { node, .. } => node,
        }
    }
}

/// Runs one command route; returns whether the connection may be kept.
pub async fn handle(worker: &Ctx, conn: &mut Conn, head: &RequestHead, route: CommandRoute<'_>, body: Bytes) -> bool {
    let keep = head.keep_alive;
    let method = if head.method == "HEAD" { "GET" } else { head.method.as_str() };
    let node = route.node();
    let config = worker.config.borrow().clone();
    let Some(entry) = config.node(node) else {
        let msg = format!("no node `{}` is configured", error::clip(node));
        return respond_error(conn, 404, &msg, Some("node_not_found"), &[], keep).await;
    };
    let req = match &route {
        CommandRoute::CloseLink { index, .. } if method == "POST" => {
            return close_link(worker, conn, node, index, keep).await;
        }
        CommandRoute::CloseLink { .. } => {
            return crate::surface::method_not_allowed(conn, head, ("allow", "POST"), keep).await.is_ok() && keep
        }
        CommandRoute::Capabilities { provider, .. } if method == "GET" => {
            command(pb::NodeCommandKind::Capabilities, provider.unwrap_or_default(), Bytes::new())
        }
        CommandRoute::Transport { .. } if method == "GET" => {
            command(pb::NodeCommandKind::TransportStatus, "", Bytes::new())
        }
        CommandRoute::Runs { .. } if method == "GET" => match runs_query(head.query().unwrap_or_default()) {
            Ok(payload) => command(pb::NodeCommandKind::Runs, "", Bytes::from(payload.to_string())),
            Err(msg) => return respond_error(conn, 400, &msg, Some("invalid_request"), &[], keep).await,
        },
        CommandRoute::Run { run_id, .. } if method == "GET" => {
            if run_id.is_empty() || run_id.len() > MAX_RUN_ID_BYTES || !run_id.bytes().all(|b| b.is_ascii_graphic()) {
                let msg = format!("`{}` is not a run id", error::clip(run_id));
                return respond_error(conn, 400, &msg, Some("invalid_request"), &[], keep).await;
            }
            let payload = serde_json::json!({ "run_id": run_id }).to_string();
            command(pb::NodeCommandKind::Run, "", Bytes::from(payload))
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
    // Links in order: the one on this core first.
    let links: Vec<(u32, mailbox::Sender<SessionCmd>)> = worker
        .routes
        .borrow()
        .get(node)
        .map(|r| r.order(worker.index, 0).into_iter().map(|l| (l.index, l.session.clone())).collect())
        .unwrap_or_default();
    if links.is_empty() {
        let msg = format!("node `{node}` is not connected");
        return respond_error(conn, 503, &msg, Some("node_not_ready"), &[("retry-after", "1")], keep).await;
    }
    let transport = req.kind == pb::NodeCommandKind::TransportStatus as i32;
    // Transport status is per link: every link is asked. Anything else
    // goes to one link (the first that takes it).
    let targets = if transport { links } else { links.into_iter().take(1).collect() };
    let mut answers = Vec::with_capacity(targets.len());
    for (index, session) in targets {
        let (reply, rx) = oneshot();
        if session.try_send(SessionCmd::Command { req: req.clone(), reply }).is_err() {
            let msg = format!("node `{node}` is busy");
            return respond_error(conn, 503, &msg, Some("node_busy"), &[("retry-after", "1")], keep).await;
        }
        answers.push((index, rx));
    }
    let mut responses = Vec::with_capacity(answers.len());
    for (index, rx) in answers {
        match iop_core::rt::time::timeout(COMMAND_TIMEOUT, rx).await {
            Ok(Some(resp)) => responses.push((index, resp)),
            Ok(None) => {
                let msg = format!("node `{node}` went away before answering");
                return respond_error(conn, 502, &msg, Some("node_disconnected"), &[], keep).await;
            }
            Err(_) => {
                let msg = format!("node `{node}` did not answer within {} s", COMMAND_TIMEOUT.as_secs());
                return respond_error(conn, 504, &msg, Some("node_timeout"), &[], keep).await;
            }
        }
    }
    let headers = [("cache-control", "no-store")];
    if transport {
        let body = merge_transport(&responses);
        return conn.respond(200, "application/json", &headers, &body, keep).await.is_ok() && keep;
    }
    let Some((_, resp)) = responses.pop() else { return false };
    let store = matches!(route, CommandRoute::Runs { .. } | CommandRoute::Run { .. });
    if store && resp.result_json.len() > MAX_RUNS_ANSWER_BYTES {
        let msg = format!("node `{node}` answered {} bytes, more than a runs answer may be", resp.result_json.len());
        return respond_error(conn, 502, &msg, Some("answer_too_large"), &[], keep).await;
    }
    let status = u16::try_from(resp.status).ok().filter(|s| (200..=599).contains(s));
    if let CommandRoute::Run { run_id, .. } = route {
        if status == Some(404) {
            let msg = format!("node `{node}` holds no run `{}`", error::clip(run_id));
            return respond_error(conn, 404, &msg, Some("run_not_found"), &[], keep).await;
        }
    }
    if resp.ok {
        conn.respond(status.unwrap_or(200), "application/json", &headers, &resp.result_json, keep).await.is_ok() && keep
    } else {
        respond_error(conn, status.unwrap_or(502), &resp.error, Some("command_failed"), &[], keep).await
    }
}

/// Closes ready link `index` of `node` (its in-flight runs fail; the node
/// reconnects the link into the same generation).
async fn close_link(worker: &Ctx, conn: &mut Conn, node: &str, index: &str, keep: bool) -> bool {
    let session = index.parse::<u32>().ok().and_then(|i| {
        let routes = worker.routes.borrow();
        routes.get(node).and_then(|r| r.links.iter().find(|l| l.index == i).map(|l| l.session.clone()))
    });
    let Some(session) = session else {
        let msg = format!("node `{node}` has no ready link `{}`", error::clip(index));
        return respond_error(conn, 404, &msg, Some("link_not_found"), &[], keep).await;
    };
    if session.try_send(SessionCmd::Close { reason: "closed_by_admin".into() }).is_err() {
        let msg = format!("node `{node}` is busy");
        return respond_error(conn, 503, &msg, Some("node_busy"), &[("retry-after", "1")], keep).await;
    }
    let body = serde_json::to_vec(&serde_json::json!({"closing": true})).unwrap_or_default();
    conn.respond(202, "application/json", &[("cache-control", "no-store")], &body, keep).await.is_ok() && keep
}

/// One transport status of the whole node from each link's: the totals,
/// per provider summed, and each link's own (`links`).
fn merge_transport(responses: &[(u32, pb::NodeCommandResponse)]) -> Vec<u8> {
    let mut total = serde_json::json!({"streams": 0, "runs": 0, "tunnels": 0, "waiting_for_credit": 0,
                                       "queued_to_edge_bytes": 0, "draining": false});
    let mut providers: std::collections::BTreeMap<String, (u64, u64)> = std::collections::BTreeMap::new();
    let mut links = Vec::with_capacity(responses.len());
    for (index, resp) in responses {
        let mut v: serde_json::Value = serde_json::from_slice(&resp.result_json).unwrap_or_default();
        for key in ["streams", "runs", "tunnels", "waiting_for_credit", "queued_to_edge_bytes"] {
            let sum = total[key].as_u64().unwrap_or(0) + v[key].as_u64().unwrap_or(0);
            total[key] = sum.into();
        }
        if v["draining"] == true {
            total["draining"] = true.into();
        }
        for p in v["providers"].as_array().into_iter().flatten() {
            let e = providers.entry(p["id"].as_str().unwrap_or_default().to_owned()).or_default();
            e.0 += p["runs"].as_u64().unwrap_or(0);
            e.1 += p["tunnels"].as_u64().unwrap_or(0);
        }
        v["link"] = (*index).into();
        links.push(v);
    }
    links.sort_by_key(|l| l["link"].as_u64());
    total["providers"] = providers
        .into_iter()
        .map(|(id, (runs, tunnels))| serde_json::json!({"id": id, "runs": runs, "tunnels": tunnels}))
        .collect();
    total["links"] = links.into();
    serde_json::to_vec(&total).unwrap_or_default()
}

/// The `RUNS` payload of a runs query: `limit` (1..=[`MAX_RUNS_LIMIT`])
/// and `status` (one of [`RUN_STATUSES`]), each optional; anything else is
/// refused, so a misspelt filter never lists every run.
fn runs_query(query: &str) -> Result<serde_json::Value, String> {
    let mut payload = serde_json::Map::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value);
        let field = match key {
            "limit" => match value.parse::<u32>() {
                Ok(n) if (1..=MAX_RUNS_LIMIT).contains(&n) => serde_json::Value::from(n),
                _ => {
                    return Err(format!(
                        "`limit` must be an integer from 1 to {MAX_RUNS_LIMIT}, not `{}`",
                        error::clip(&value)
                    ))
                }
            },
            "status" if RUN_STATUSES.contains(&value.as_str()) => serde_json::Value::from(value),
            "status" => {
                return Err(format!(
                    "`status` must be one of {}, not `{}`",
                    RUN_STATUSES.join(", "),
                    error::clip(&value)
                ))
            }
            other => return Err(format!("unknown parameter `{}`: use `limit` and `status`", error::clip(other))),
        };
        if payload.insert(key.to_owned(), field).is_some() {
            return Err(format!("`{key}` is given twice"));
        }
    }
    Ok(serde_json::Value::Object(payload))
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
        assert_eq!(CommandRoute::parse("/admin/v1/nodes/n1/runs"), Some(CommandRoute::Runs { node: "n1" }));
        assert_eq!(
            CommandRoute::parse("/admin/v1/nodes/n1/runs/r-1-2"),
            Some(CommandRoute::Run { node: "n1", run_id: "r-1-2" })
        );
        assert_eq!(CommandRoute::parse("/admin/v1/nodes/n1/runs/r/x"), None);
        assert_eq!(CommandRoute::parse("/admin/v1/nodes"), None);
        assert_eq!(CommandRoute::parse("/admin/v1/nodes/n1/providers/ol/api/tags/x"), None);
    }

    #[test]
    fn runs_queries() {
        assert_eq!(runs_query("").unwrap(), serde_json::json!({}));
        assert_eq!(runs_query("limit=500&status=error").unwrap(), serde_json::json!({"limit": 500, "status": "error"}));
        assert_eq!(runs_query("status=cancelled&").unwrap(), serde_json::json!({"status": "cancelled"}));
        for (bad, needle) in [
            ("limit=0", "`limit` must be"),
            ("limit=501", "`limit` must be"),
            ("limit=-1", "`limit` must be"),
            ("limit=", "`limit` must be"),
            ("limit=1x", "`limit` must be"),
            ("status=running", "`status` must be one of complete, error, cancelled"),
            ("status=Complete", "`status` must be"),
            ("state=error", "unknown parameter `state`"),
            ("limit=1&limit=2", "given twice"),
        ] {
            let e = runs_query(bad).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }

    #[test]
    fn query_values() {
        assert_eq!(query_value("a=1&model=llama3%3A8b", "model").as_deref(), Some("llama3:8b"));
        assert_eq!(query_value("model=a+b%zz%", "model").as_deref(), Some("a b%zz%"));
        assert_eq!(query_value("x=1", "model"), None);
    }
}
