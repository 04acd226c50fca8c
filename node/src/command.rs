//! Node commands from the edge: capabilities and transport status are
//! answered at once; a call to a provider's own API (Ollama's `/api/tags`,
//! `/api/ps`, `/api/show`) and a capabilities probe of one exact target run
//! in a task of their own, so a slow provider never holds up the session,
//! and answer with the same correlation id.

use std::rc::Rc;

use bytes::Bytes;
use iop_core::{
    rt::frames::FrameWriter,
    wire::pb::{self, envelope::Body, Envelope},
};
use serde::Deserialize;

use crate::run::RunManager;

/// A provider API call (`payload_json` of `PROVIDER_API`).
#[derive(Debug, Deserialize)]
struct ProviderCall {
    method: String,
    path: String,
    #[serde(default)]
    body: Option<serde_json::Value>,
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
