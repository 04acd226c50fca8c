//! `POST /v1/messages` for a provider that does not speak the Messages API:
//! the request is translated onto an OpenAI chat body
//! ([`iop_core::messages::to_chat`]), run on the normalized path, and its
//! events rendered as the Messages API answers (streamed events, or one
//! `message`). What the translation could not honour is named in the
//! answer's [`DROPPED_HEADER`] and the access log, never left out silently.

use std::rc::Rc;

use bytes::BytesMut;
use iop_core::{exec::RunFailure, messages, wire::pb};

use super::{message::MessageAggregate, stream::MessagesEncoder};
use crate::{
    ctx::Ctx,
    dispatch::{self, RunStream},
    pool::Admitted,
    server::{with_disconnect_watch, BodyPermit, Conn, WHOLE_WATCH},
    surface::{
        dialect::Dialect,
        exchange::estimated_tokens,
        failures::ended_without_result,
        replay::{Replay, ReplayChance},
        reply, write,
    },
};

/// The answer's header naming what the translation left out
/// (comma-separated), present only when something was.
pub const DROPPED_HEADER: &str = "iop-dropped";

const D: Dialect = Dialect::Anthropic;

/// Translates and runs an admitted Messages request on the normalized path;
/// resolves to whether the connection may be kept. As the chat answer does,
/// it submits before the returned future, which holds only what answering
/// needs (the request's parts go to `chance`).
pub fn answer<'a>(
    worker: &Rc<Ctx>,
    conn: &'a mut Conn,
    parts: Replay,
    permit: Option<BodyPermit>,
    admitted: Admitted,
    chance: &'a mut ReplayChance,
) -> impl std::future::Future<Output = bool> + 'a {
    let keep = parts.head.keep_alive;
    let target = admitted.target.upstream_model.clone();
    let translated = messages::to_chat(&parts.bytes, &target, &messages::Limits::default())
        .and_then(|t| refuse_if_strict(&parts.group, &t.dropped).map(|()| t));
    let estimate = estimated_tokens(parts.bytes.len());
    let submitted = translated.map(|t| {
        let principal = conn.exchange.api_key.as_ref().map(|k| k.entry.name.clone()).unwrap_or_default();
        let run_req = pb::RunRequest {
            body: t.body.into(),
            operation: pb::RunOperation::Chat as i32,
            whole: !t.stream,
            principal,
            ..Default::default()
        };
        let key = admitted.lease.key().clone();
        let mut submitted = dispatch::submit(worker, &parts.group.name, admitted, run_req);
        if let Ok(s) = &mut submitted {
            s.report_to(&conn.exchange.finish, &key);
        }
        let dropped = t.dropped.join(", ");
        if !dropped.is_empty() {
            conn.exchange.note_dropped(&dropped);
        }
        (submitted, t.stream, t.stop_sequences, dropped)
    });
    drop(permit);
    chance.keep(parts);
    let write_timeout = worker.config.borrow().http.idle_timeout;
    async move {
        let (mut submitted, streams, stops, dropped) = match submitted {
            Ok(s) => s,
            Err(invalid) => {
                // The client's request is at fault: never replayed.
                chance.commit();
                let msg = invalid.to_string();
                return reply::error(&mut conn.responder(), D, invalid.status, &msg, "invalid_request", keep).await;
            }
        };
        let run = match &mut submitted {
            Ok(run) => run,
            Err(e) => return reply::dispatch_error(&mut conn.responder(), D, e, keep).await,
        };
        let id = ["msg_", run.run_id()].concat();
        let extra: &[(&str, &str)] = if dropped.is_empty() { &[] } else { &[(DROPPED_HEADER, &dropped)] };
        if streams {
            let make = |reported: &str| {
                MessagesEncoder::new(&id, if reported.is_empty() { &target } else { reported }, estimate, stops)
            };
            write::stream(conn, run, D, extra, make, keep, write_timeout, chance).await
        } else {
            whole(conn, run, &id, &target, stops, extra, keep, chance).await
        }
    }
}

async fn collect(run: &mut RunStream, agg: &mut MessageAggregate) -> Result<(), RunFailure> {
    while let Some(ev) = run.next().await {
        if agg.on_event(ev)? {
            return Ok(());
        }
    }
    Err(ended_without_result())
}

/// A strict model (`strict = true`) refuses what its provider cannot
/// honour instead of serving it without.
fn refuse_if_strict(group: &iop_core::config::ModelGroup, dropped: &[String]) -> Result<(), messages::Invalid> {
    if !group.strict || dropped.is_empty() {
        return Ok(());
    }
    let names = dropped.join(", ");
    Err(messages::Invalid {
        status: 400,
        param: dropped[0].clone(),
        message: format!(
            "model `{}` is strict and its provider cannot honour: {names}; remove them or use a model that serves \
             this API natively",
            crate::surface::error::clip(&group.name)
        ),
    })
}

/// Waits for the whole run and answers with one `message`.
#[allow(clippy::too_many_arguments)] // the answer's parts, each used once
async fn whole(
    conn: &mut Conn,
    run: &mut RunStream,
    id: &str,
    model: &str,
    stops: Vec<String>,
    extra: &[(&str, &str)],
    keep: bool,
    chance: &mut ReplayChance,
) -> bool {
    let mut agg = MessageAggregate::new(stops);
    let result = {
        let Conn { rd, buf, .. } = &mut *conn;
        with_disconnect_watch::<WHOLE_WATCH, _, _>(rd, buf, std::pin::pin!(collect(run, &mut agg))).await
    };
    match result {
        None => return false,
        // Nothing was written yet: maybe held back for a replay elsewhere.
        Some(Err(f)) => {
            return match chance.hold(f) {
                Some(f) => reply::failure(&mut conn.responder(), D, &f, keep).await,
                None => false,
            }
        }
        Some(Ok(())) => {}
    }
    chance.commit();
    let mut body = BytesMut::new();
    agg.write(&mut body, id, model);
    let request_id = run.run_id().to_owned();
    let mut headers = vec![("x-request-id", request_id.as_str()), ("request-id", request_id.as_str())];
    headers.extend_from_slice(extra);
    conn.respond(200, "application/json", &headers, &body, keep).await.is_ok() && keep
}
