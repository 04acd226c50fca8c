//! `POST /v1/responses` for a provider that does not speak the Responses
//! API: the request is translated onto an OpenAI chat body
//! ([`iop_core::responses::to_chat`]), run on the normalized path, and its
//! events rendered as the Responses API answers (typed events, or one
//! `response` object); see [`crate::surface::translated`].

use std::{
    rc::Rc,
    time::{SystemTime, UNIX_EPOCH},
};

use iop_core::responses;

use super::{object::ResponseAggregate, stream::ResponsesEncoder, Head, ResponseMeta};
use crate::{
    ctx::Ctx,
    pool::Admitted,
    server::{BodyPermit, Conn},
    surface::{
        dialect::Dialect,
        replay::{Replay, ReplayChance},
        reply, translated, write,
    },
};

const D: Dialect = Dialect::OpenAi;

/// Translates and runs an admitted Responses request on the normalized
/// path; resolves to whether the connection may be kept. It submits before
/// the returned future, which holds only what answering needs.
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
    // Over HTTP there is no earlier response to chain onto: the
    // translation refuses `previous_response_id` and `store: true`.
    let places = parts.top.fields.as_ref();
    let mut submitted = responses::to_chat_at(&parts.bytes, places, &target, &responses::Options::default())
        .and_then(|t| translated::refuse_if_strict(&parts.group, &t.dropped).map(|()| t))
        .map(|t| {
            let s = translated::submit(worker, conn, &parts.group.name, admitted, t.body, t.stream, &t.dropped);
            // Rendered now (the echoed fields' JSON maps were 2 KB a
            // stream until its first token) and boxed: held by the answer's
            // future until the encoder (or the aggregate) takes it, and a
            // stream holds its future for as long as it is open.
            let meta = Box::new(Head::new(ResponseMeta {
                id: s.run.as_ref().map_or_else(|_| String::new(), |run| ["resp_", run.run_id()].concat()),
                model: target.to_string(),
                created_at: unix_now(),
                echo: t.echo,
                namespaced: t.namespaced,
            }));
            (s, t.stream, Some(meta))
        });
    drop(permit);
    chance.keep(parts);
    let write_timeout = worker.config.borrow().http.idle_timeout;
    async move {
        // By reference: a moved binding would be stored twice in this state.
        let (s, streams, meta) = match &mut submitted {
            Ok(s) => s,
            Err(invalid) => return translated::refuse(conn, D, invalid, keep, chance).await,
        };
        let extra = translated::dropped_headers(&s.dropped);
        let run = match &mut s.run {
            Ok(run) => run,
            Err(e) => return reply::dispatch_error(&mut conn.responder(), D, e, keep).await,
        };
        // Taken out, so it goes with the encoder or the aggregate.
        let head = meta.take().unwrap_or_else(|| Box::new(Head::new(ResponseMeta::default())));
        if *streams {
            let make = |reported: &str| {
                let mut head = *head;
                if !reported.is_empty() {
                    head.model = reported.to_owned();
                }
                ResponsesEncoder::from_head(head)
            };
            write::stream(conn, run, D, &extra, make, keep, write_timeout, chance).await
        } else {
            let mut agg = ResponseAggregate::from_head(*head);
            let write = |a: &ResponseAggregate, out: &mut bytes::BytesMut| a.write(out);
            translated::whole(conn, run, D, &mut agg, write, &extra, keep, chance).await
        }
    }
}

/// Seconds since the Unix epoch (`created_at`).
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
