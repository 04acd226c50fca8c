//! The normalized path of the OpenAI surface: an admitted chat completion
//! (or embeddings request) for a provider that does not speak the OpenAI
//! HTTP API is sent to its node as the client's body (`model` rewritten,
//! nothing else), and the run's events are rendered in OpenAI's exact
//! shapes: streamed as SSE chunks, or aggregated into one `chat.completion`
//! (several choices, tool calls, refusals, log probabilities, every finish
//! reason), or an embeddings list.

use std::{
    rc::Rc,
    time::{SystemTime, UNIX_EPOCH},
};

use bytes::BytesMut;
use iop_core::{
    exec::{ExecEvent, RunFailure, TextKind},
    wire::pb,
};
use serde_json::{json, Value};

use super::{aggregate::Aggregate, chunk::ChunkEncoder};
use crate::surface::failures::{ended_without_result, node_cancelled, protocol};
use crate::surface::{
    dialect::Dialect,
    encode::EventEncoder,
    replay::{Replay, ReplayChance},
    reply,
    route::Route,
    write,
};
use crate::{
    ctx::Ctx,
    dispatch::{self, RunStream},
    pool::Admitted,
    server::{with_disconnect_watch, BodyPermit, Conn, WHOLE_WATCH},
};

/// Runs an admitted request on the normalized path; resolves to whether
/// the connection may be kept. `permit` is the body's share of the core's
/// budget, held until the run is handed to its node. The run is submitted
/// before the returned future, which holds only what answering needs: the
/// request's parts go to `chance` (kept until the answer commits when it
/// may be replayed, else dropped), so a stream keeps none of them.
pub fn normalized<'a>(
    worker: &Rc<Ctx>,
    conn: &'a mut Conn,
    route: Route,
    parts: Replay,
    permit: Option<BodyPermit>,
    admitted: Admitted,
    chance: &'a mut ReplayChance,
) -> impl std::future::Future<Output = bool> + 'a {
    let (keep, top) = (parts.head.keep_alive, &parts.top);
    let operation = match route {
        Route::Embeddings => pb::RunOperation::Embeddings,
        _ => pb::RunOperation::Chat,
    };
    let body = top.with_model(&parts.bytes, &admitted.target.upstream_model);
    let asked_model = admitted.target.upstream_model.clone();
    let principal = conn.exchange.api_key.as_ref().map(|k| k.entry.name.clone()).unwrap_or_default();
    let run_req = pb::RunRequest {
        body,
        operation: operation as i32,
        whole: !top.stream,
        principal,
        session_id: conn.exchange.session_id().to_owned(),
        ..Default::default()
    };
    let key = admitted.lease.key().clone();
    let mut submitted = dispatch::submit(worker, &parts.group.name, admitted, run_req);
    if let Ok(s) = &mut submitted {
        s.report_to(&conn.exchange.finish, &key);
    }
    drop(permit);
    let (streams, include_usage, base64) = (top.stream, top.include_usage(), top.encoding_base64());
    chance.keep(parts);
    // A client that accepts nothing for this long is cut (its run is
    // then cancelled on the node).
    let write_timeout = worker.config.borrow().http.idle_timeout;
    async move {
        // By reference: a moved binding would be stored twice in this state.
        let run = match &mut submitted {
            Ok(run) => run,
            Err(e) => return reply::dispatch_error(&mut conn.responder(), Dialect::OpenAi, e, keep).await,
        };
        // The answer names the model that answered (as the tunnel's does): the
        // provider's own name when it reported one, else the one asked for.
        let meta = Meta { model: asked_model, id: ["chatcmpl-", run.run_id()].concat(), created: unix_now() };
        if route == Route::Embeddings {
            embeddings(conn, run, &meta, base64, keep).await
        } else if streams {
            let make = |reported: &str| {
                StreamRender::new(ChunkEncoder::new(&meta.id, meta.model(reported), meta.created), include_usage)
            };
            write::stream(conn, run, Dialect::OpenAi, &[], make, keep, write_timeout, chance).await
        } else {
            aggregate(conn, run, &meta, keep, chance).await
        }
    }
}

struct Meta {
    model: std::sync::Arc<str>,
    id: String,
    created: u64,
}

impl Meta {
    /// The model to name: `reported` by the provider's start, if any.
    fn model<'a>(&'a self, reported: &'a str) -> &'a str {
        if reported.is_empty() {
            &self.model
        } else {
            reported
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Turns run events into SSE chunks, choice by choice.
struct StreamRender {
    enc: ChunkEncoder,
    include_usage: bool,
    /// Choices whose role chunk went out.
    started: Vec<u32>,
    /// Choices whose finish chunk went out.
    finished: Vec<u32>,
}

impl StreamRender {
    fn new(enc: ChunkEncoder, include_usage: bool) -> Self {
        Self { enc, include_usage, started: Vec::new(), finished: Vec::new() }
    }

    fn ensure_started(&mut self, sse: &mut BytesMut, choice: u32) {
        // Nearly every event is of the first choice started: one compare.
        if self.started.first() != Some(&choice) && !self.started.contains(&choice) {
            self.started.push(choice);
            self.enc.role(sse, choice);
        }
    }
}

impl EventEncoder for StreamRender {
    fn text(&mut self, sse: &mut BytesMut, kind: TextKind, text: &str) {
        self.ensure_started(sse, 0);
        self.enc.text(sse, kind, text);
    }

    /// Appends the SSE for `ev`; true when it ended the stream.
    fn event(&mut self, sse: &mut BytesMut, ev: ExecEvent) -> bool {
        match ev {
            ExecEvent::Start { .. } => {
                self.ensure_started(sse, 0);
                false
            }
            ExecEvent::Delta(d) => {
                self.ensure_started(sse, d.choice);
                self.enc.delta(sse, &d);
                false
            }
            ExecEvent::ChoiceFinish { choice, finish_reason, .. } => {
                self.ensure_started(sse, choice);
                if !self.finished.contains(&choice) {
                    self.finished.push(choice);
                    self.enc.finish(sse, choice, &finish_reason);
                }
                false
            }
            // Not a chat answer: the adapter broke its contract.
            ExecEvent::Embeddings(_) => {
                self.enc.error(sse, &protocol("the provider answered a chat request with embeddings"));
                true
            }
            ExecEvent::Complete { finish_reason, usage } => {
                self.ensure_started(sse, 0);
                if !self.finished.contains(&0) {
                    self.enc.finish(sse, 0, &finish_reason);
                }
                // Unknown usage stays absent: no chunk of invented zeros.
                if let (true, Some(usage)) = (self.include_usage, usage) {
                    self.enc.usage(sse, &usage);
                }
                self.enc.done(sse);
                true
            }
            ExecEvent::Error(f) => {
                self.enc.error(sse, &f);
                true
            }
            ExecEvent::Cancelled { reason } => {
                self.enc.error(sse, &node_cancelled(&reason));
                true
            }
        }
    }
}

/// The node cancelled a run the client still wanted (e.g. its drain
/// deadline passed): a server-side failure.
async fn collect(run: &mut RunStream) -> Result<Aggregate, RunFailure> {
    let mut agg = Aggregate::new();
    while let Some(ev) = run.next().await {
        if agg.on_event(ev)? {
            return Ok(agg);
        }
    }
    Err(ended_without_result())
}

/// Waits for the whole run and answers with one `chat.completion`.
async fn aggregate(conn: &mut Conn, run: &mut RunStream, meta: &Meta, keep: bool, chance: &mut ReplayChance) -> bool {
    let result = {
        let Conn { rd, buf, .. } = &mut *conn;
        with_disconnect_watch::<WHOLE_WATCH, _, _>(rd, buf, std::pin::pin!(collect(run))).await
    };
    let agg = match result {
        None => return false,
        // Nothing was written yet: maybe held back for a replay elsewhere.
        Some(Err(f)) => match chance.hold(f) {
            Some(f) => return reply::failure(&mut conn.responder(), Dialect::OpenAi, &f, keep).await,
            None => return false,
        },
        Some(Ok(agg)) => agg,
    };
    chance.commit();
    let mut body = BytesMut::new();
    agg.write(&mut body, &meta.id, meta.created, meta.model(&agg.model));
    let request_id = run.run_id().to_owned();
    conn.respond(200, "application/json", &[("x-request-id", &request_id)], &body, keep).await.is_ok() && keep
}

/// Waits for an embeddings run and answers with OpenAI's list shape
/// (`base64`: little-endian f32 vectors, as `encoding_format: "base64"`).
async fn embeddings(conn: &mut Conn, run: &mut RunStream, meta: &Meta, base64: bool, keep: bool) -> bool {
    let result = {
        let Conn { rd, buf, .. } = &mut *conn;
        with_disconnect_watch::<WHOLE_WATCH, _, _>(
            rd,
            buf,
            std::pin::pin!(async {
                let (mut vectors, mut model) = (None, String::new());
                while let Some(ev) = run.next().await {
                    match ev {
                        ExecEvent::Start { model: m } => model = m,
                        ExecEvent::Embeddings(v) => vectors = Some(v),
                        ExecEvent::Complete { usage, .. } => {
                            return vectors
                                .map(|v| (v, usage, model))
                                .ok_or_else(|| protocol("the provider sent no embeddings"))
                        }
                        ExecEvent::Error(f) => return Err(f),
                        ExecEvent::Cancelled { reason } => return Err(node_cancelled(&reason)),
                        _ => {}
                    }
                }
                Err(ended_without_result())
            }),
        )
        .await
    };
    let (vectors, usage, model) = match result {
        None => return false,
        Some(Err(f)) => return reply::failure(&mut conn.responder(), Dialect::OpenAi, &f, keep).await,
        Some(Ok(r)) => r,
    };
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 { json!(encode_f32s(v)) } else { json!(v) };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let mut v = json!({"object": "list", "data": data, "model": meta.model(&model)});
    if let Some(u) = usage {
        v["usage"] = json!({"prompt_tokens": u.input_tokens, "total_tokens": u.input_tokens});
    }
    let body = serde_json::to_vec(&v).unwrap_or_default();
    let request_id = run.run_id().to_owned();
    conn.respond(200, "application/json", &[("x-request-id", &request_id)], &body, keep).await.is_ok() && keep
}

/// Base64 of the vector's little-endian f32 bytes.
fn encode_f32s(v: &[f32]) -> String {
    use base64::Engine;
    let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    #[test]
    fn a_token_read_in_place_writes_its_chunk() {
        for include_usage in [false, true] {
            crate::surface::encode::check_text_writes_its_event(|| {
                StreamRender::new(ChunkEncoder::new("c", "m", 1), include_usage)
            });
        }
    }

    use iop_core::exec::{Delta, Part};

    use super::*;

    fn render(events: Vec<ExecEvent>, include_usage: bool) -> Vec<Value> {
        let mut r = StreamRender::new(ChunkEncoder::new("c", "m", 1), include_usage);
        let mut sse = BytesMut::new();
        for ev in events {
            r.event(&mut sse, ev);
        }
        String::from_utf8(sse.to_vec())
            .unwrap()
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(|d| if d == "[DONE]" { json!("[DONE]") } else { serde_json::from_str(d).unwrap() })
            .collect()
    }

    fn d(choice: u32, part: Part) -> ExecEvent {
        ExecEvent::Delta(Delta { choice, part, logprobs: None })
    }

    #[test]
    fn several_choices_each_start_and_finish_once() {
        let chunks = render(
            vec![
                ExecEvent::Start { model: "x".into() },
                d(0, Part::Content("a".into())),
                d(1, Part::Content("b".into())),
                ExecEvent::ChoiceFinish { choice: 0, finish_reason: "stop".into(), stop_sequence: None },
                ExecEvent::ChoiceFinish { choice: 1, finish_reason: "length".into(), stop_sequence: None },
                ExecEvent::Complete { finish_reason: "stop".into(), usage: None },
            ],
            true,
        );
        let summary: Vec<(u64, Value, Value)> = chunks
            .iter()
            .filter(|c| c.is_object())
            .map(|c| {
                (
                    c["choices"][0]["index"].as_u64().unwrap(),
                    c["choices"][0]["delta"].clone(),
                    c["choices"][0]["finish_reason"].clone(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (0, json!({"role": "assistant", "content": ""}), Value::Null),
                (0, json!({"content": "a"}), Value::Null),
                (1, json!({"role": "assistant", "content": ""}), Value::Null),
                (1, json!({"content": "b"}), Value::Null),
                (0, json!({}), json!("stop")),
                (1, json!({}), json!("length")),
            ]
        );
        // No usage chunk without usage; [DONE] last.
        assert_eq!(chunks.last(), Some(&json!("[DONE]")));
    }

    #[test]
    fn base64_embeddings_are_little_endian_f32() {
        assert_eq!(encode_f32s(&[1.0]), "AACAPw==");
    }
}
