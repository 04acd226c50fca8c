//! Node commands from the edge: capabilities and transport status are
//! answered at once; a call to a provider's own API (Ollama's `/api/tags`,
//! `/api/ps`, `/api/show`), a capabilities probe of one exact target and a
//! read of the run store (`RUNS`, `RUN`: on the store's thread, never the
//! reactor) run in a task of their own, so a slow provider or store never
//! holds up the session, and answer with the same correlation id.

use std::rc::Rc;

use bytes::Bytes;
use iop_core::{
    rt::frames::FrameWriter,
    wire::pb::{self, envelope::Body, Envelope},
};
use serde::Deserialize;

use crate::{
    run::RunManager,
    store::{Query, Status, DEFAULT_LIMIT, MAX_LIMIT},
};

/// A provider API call (`payload_json` of `PROVIDER_API`).
#[derive(Debug, Deserialize)]
struct ProviderCall {
    method: String,
    path: String,
    #[serde(default)]
    body: Option<serde_json::Value>,
}

/// `payload_json` of `RUNS` (empty: the defaults).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunsCall {
    #[serde(default)]
    limit: Option<u32>,
    #[serde(default)]
    status: Option<String>,
}

/// `payload_json` of `RUN`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunCall {
    run_id: String,
}

/// The longest run id `RUN` looks up.
const MAX_RUN_ID: usize = 256;

/// The store query `cmd` asks for, or why it is refused (status, message).
fn store_query(kind: pb::NodeCommandKind, payload: &[u8]) -> Result<Query, (u32, String)> {
    let bad = |e: serde_json::Error| (400, format!("invalid payload: {e}"));
    let blank = payload.iter().all(u8::is_ascii_whitespace);
    // serde reads a struct from an array too: only an object is one.
    if !blank && payload.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err((400, "invalid payload: expected a JSON object".into()));
    }
    if kind == pb::NodeCommandKind::Run {
        let call: RunCall = serde_json::from_slice(payload).map_err(bad)?;
        if call.run_id.is_empty() || call.run_id.len() > MAX_RUN_ID {
            return Err((400, format!("invalid payload: `run_id` must be 1 to {MAX_RUN_ID} bytes")));
        }
        return Ok(Query::Run { run_id: call.run_id });
    }
    let call: RunsCall = if blank { RunsCall::default() } else { serde_json::from_slice(payload).map_err(bad)? };
    let limit = call.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err((400, format!("invalid payload: `limit` {limit} is not within 1..={MAX_LIMIT}")));
    }
    let status = match call.status.as_deref() {
        None => None,
        Some(s) => Some(Status::parse(s).ok_or_else(|| {
            let names: Vec<&str> = Status::ALL.iter().map(|s| s.as_str()).collect();
            (400, format!("invalid payload: unknown `status` `{}`, expected one of {}", clip(s), names.join(", ")))
        })?),
    };
    Ok(Query::Runs { limit, status })
}

/// Answers `cmd` (correlation id `cid`) on `writer`.
pub fn handle(cid: u64, cmd: pb::NodeCommandRequest, manager: &Rc<RunManager>, writer: &FrameWriter) {
    let answer = |resp: pb::NodeCommandResponse| {
        let _ = writer.send(&Envelope { correlation_id: cid, body: Some(Body::NodeCommandResponse(resp)) });
    };
    match pb::NodeCommandKind::try_from(cmd.kind) {
        Ok(pb::NodeCommandKind::Capabilities) if !cmd.target.is_empty() => {
            // CAPABILITIES recovery: the same bounded exact-target probe a
            // stall terminal joins, numbered from this link's sequence.
            let Some(adapter) = manager.adapter(&cmd.adapter) else {
                return answer(failed(404, format!("node has no provider `{}`", clip(&cmd.adapter))));
            };
            let (writer, manager) = (writer.clone(), manager.clone());
            monoio::spawn(async move {
                let health = adapter.probe_health(&cmd.target).await;
                let seq = manager.next_health_seq();
                tracing::info!(
                    provider = %cmd.adapter,
                    provider_health = health.as_str(),
                    health_observation_seq = seq,
                    "node_capabilities_probe"
                );
                let v = serde_json::json!({
                    "adapter": cmd.adapter,
                    "target": cmd.target,
                    "status": health.as_str(),
                    "health_observation_seq": seq,
                });
                let _ = writer.send(&Envelope {
                    correlation_id: cid,
                    body: Some(Body::NodeCommandResponse(ok(200, json_bytes(&v)))),
                });
            });
        }
        Ok(pb::NodeCommandKind::Capabilities) => match manager.capabilities(&cmd.adapter) {
            Some(v) => answer(ok(200, json_bytes(&v))),
            None => answer(failed(404, format!("node has no provider `{}`", clip(&cmd.adapter)))),
        },
        Ok(pb::NodeCommandKind::TransportStatus) => answer(ok(200, json_bytes(&manager.transport_status()))),
        Ok(pb::NodeCommandKind::ProviderApi) => {
            let Some(adapter) = manager.adapter(&cmd.adapter) else {
                return answer(failed(404, format!("node has no provider `{}`", clip(&cmd.adapter))));
            };
            let call: ProviderCall = match serde_json::from_slice(&cmd.payload_json) {
                Ok(c) => c,
                Err(e) => return answer(failed(400, format!("provider API call: invalid payload: {e}"))),
            };
            let writer = writer.clone();
            monoio::spawn(async move {
                let body = call.body.as_ref().map(|b| Bytes::from(json_bytes(b)));
                let resp = match adapter.native_api(&call.method, &call.path, body).await {
                    Ok((status, body)) => ok(u32::from(status), body),
                    Err(f) => failed(u32::from(f.status), f.message),
                };
                let _ = writer.send(&Envelope { correlation_id: cid, body: Some(Body::NodeCommandResponse(resp)) });
            });
        }
        Ok(kind @ (pb::NodeCommandKind::Runs | pb::NodeCommandKind::Run)) => {
            let Some(store) = manager.store().cloned() else {
                return answer(failed(503, "this node's run store is off (`store = false` in its config)".into()));
            };
            let query = match store_query(kind, &cmd.payload_json) {
                Ok(q) => q,
                Err((status, msg)) => return answer(failed(status, msg)),
            };
            let writer = writer.clone();
            monoio::spawn(async move {
                let resp = match store.query(query).await {
                    Ok(json) => ok(200, json),
                    Err(e) => failed(u32::from(e.status()), e.to_string()),
                };
                let _ = writer.send(&Envelope { correlation_id: cid, body: Some(Body::NodeCommandResponse(resp)) });
            });
        }
        Ok(pb::NodeCommandKind::Unspecified) | Err(_) => {
            answer(failed(400, format!("unsupported node command kind {}", cmd.kind)))
        }
    }
}

fn json_bytes(v: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

fn ok(status: u32, result: impl Into<Bytes>) -> pb::NodeCommandResponse {
    pb::NodeCommandResponse { ok: true, error: String::new(), result_json: result.into(), status }
}

fn failed(status: u32, error: String) -> pb::NodeCommandResponse {
    pb::NodeCommandResponse { ok: false, error, result_json: Bytes::new(), status }
}

/// At most 64 characters of an id from the wire, for messages.
fn clip(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn refused(kind: pb::NodeCommandKind, payload: &str, needle: &str) {
        match store_query(kind, payload.as_bytes()) {
            Err((400, msg)) => assert!(msg.contains(needle), "`{msg}` lacks `{needle}`"),
            other => panic!("{payload}: {other:?}"),
        }
    }

    #[test]
    fn runs_and_run_payloads_are_read_with_their_bounds() {
        use pb::NodeCommandKind::{Run, Runs};
        let runs = |p: &str| store_query(Runs, p.as_bytes()).unwrap();
        assert_eq!(runs(""), Query::Runs { limit: 50, status: None });
        assert_eq!(runs("{}"), Query::Runs { limit: 50, status: None });
        assert_eq!(runs(r#"{"limit":1}"#), Query::Runs { limit: 1, status: None });
        assert_eq!(runs(r#"{"limit":500,"status":"error"}"#), Query::Runs { limit: 500, status: Some(Status::Error) });
        assert_eq!(runs(r#"{"status":"cancelled"}"#), Query::Runs { limit: 50, status: Some(Status::Cancelled) });
        refused(Runs, r#"{"limit":0}"#, "`limit` 0 is not within 1..=500");
        refused(Runs, r#"{"limit":501}"#, "`limit` 501 is not within 1..=500");
        refused(Runs, r#"{"limit":-1}"#, "invalid payload");
        refused(Runs, r#"{"status":"done"}"#, "unknown `status` `done`, expected one of complete, error, cancelled");
        refused(Runs, r#"{"stat":"error"}"#, "unknown field `stat`");
        refused(Runs, "[1]", "expected a JSON object");
        refused(Runs, "7", "expected a JSON object");
        assert_eq!(store_query(Run, br#"{"run_id":"a-0-1"}"#).unwrap(), Query::Run { run_id: "a-0-1".into() });
        refused(Run, "", "invalid payload");
        refused(Run, "{}", "missing field `run_id`");
        refused(Run, r#"{"run_id":""}"#, "`run_id` must be 1 to 256 bytes");
        refused(Run, &format!(r#"{{"run_id":"{}"}}"#, "x".repeat(257)), "1 to 256 bytes");
    }
}
