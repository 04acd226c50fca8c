//! `POST /v1/messages` for a provider that does not speak the Messages API:
//! the request is translated onto an OpenAI chat body
//! ([`iop_core::messages::to_chat`]), run on the normalized path, and its
//! events rendered as the Messages API answers (streamed events, or one
//! `message`); see [`crate::surface::translated`].

use std::rc::Rc;

use iop_core::messages;

use super::{message::MessageAggregate, stream::MessagesEncoder};
use crate::{
    ctx::Ctx,
    pool::Admitted,
    server::{BodyPermit, Conn},
    surface::{
        dialect::Dialect,
        exchange::estimated_tokens,
        replay::{Replay, ReplayChance},
        reply, translated, write,
    },
};

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
    let estimate = estimated_tokens(parts.bytes.len());
    let places = parts.top.fields.as_ref();
    let mut submitted = messages::to_chat_at(&parts.bytes, places, &target, &messages::Limits::default())
        .and_then(|t| translated::refuse_if_strict(&parts.group, &t.dropped).map(|()| t))
        .map(|t| {
            let s = translated::submit(worker, conn, &parts.group.name, admitted, t.body, t.stream, &t.dropped);
            (s, t.stream, t.stop_sequences)
        });
    drop(permit);
    chance.keep(parts);
    let write_timeout = worker.config.borrow().http.idle_timeout;
    async move {
        // By reference: a moved binding would be stored twice in this state.
        let (s, streams, stops) = match &mut submitted {
            Ok(s) => s,
            Err(invalid) => return translated::refuse(conn, D, invalid, keep, chance).await,
        };
        let extra = translated::dropped_headers(&s.dropped);
        let run = match &mut s.run {
            Ok(run) => run,
            Err(e) => return reply::dispatch_error(&mut conn.responder(), D, e, keep).await,
        };
        let stops = std::mem::take(stops);
        let id = ["msg_", run.run_id()].concat();
        if *streams {
            let make = |reported: &str| {
                MessagesEncoder::new(&id, if reported.is_empty() { &target } else { reported }, estimate, stops)
            };
            write::stream(conn, run, D, &extra, make, keep, write_timeout, chance).await
        } else {
            let mut agg = MessageAggregate::new(stops);
            let write = |a: &MessageAggregate, out: &mut bytes::BytesMut| a.write(out, &id, &target);
            translated::whole(conn, run, D, &mut agg, write, &extra, keep, chance).await
        }
    }
}
