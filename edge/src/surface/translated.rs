//! What every translated answer shares: a request in a dialect the chosen
//! provider does not speak, translated onto an OpenAI chat body
//! ([`iop_core::messages`], [`iop_core::responses`]), submitted as a
//! normalized run, and answered whole from the dialect's aggregate. What
//! the translation could not honour is named in the answer's
//! [`DROPPED_HEADER`] and the access log, never left out silently; a
//! strict model refuses it instead.

use std::rc::Rc;

use bytes::BytesMut;
use iop_core::{config::ModelGroup, exec::RunFailure, messages::Invalid, wire::pb};

use super::{
    dialect::Dialect, encode::EventAggregate, error::clip, failures::ended_without_result, replay::ReplayChance, reply,
};
use crate::{
    ctx::Ctx,
    dispatch::{self, DispatchError, RunStream},
    pool::Admitted,
    server::{with_disconnect_watch, Conn, WHOLE_WATCH},
};

/// The answer's header naming what the translation left out
/// (comma-separated), present only when something was.
pub const DROPPED_HEADER: &str = "iop-dropped";

/// A strict model (`strict = true`) refuses what its provider cannot
/// honour instead of serving it without.
pub fn refuse_if_strict(group: &ModelGroup, dropped: &[String]) -> Result<(), Invalid> {
    let Some(first) = dropped.first().filter(|_| group.strict) else { return Ok(()) };
    Err(Invalid {
        status: 400,
        param: first.clone(),
        message: format!(
            "model `{}` is strict and its provider cannot honour: {}; remove them or use a model that serves \
             this API natively",
            clip(&group.name),
            dropped.join(", ")
        ),
    })
}

/// A translated request on its way: the run, and what was left out.
pub struct Submitted {
    pub run: Result<RunStream, DispatchError>,
    /// The dropped names, comma-separated ("" when none).
    pub dropped: String,
}

/// The [`DROPPED_HEADER`] to answer with when `dropped` names anything.
pub fn dropped_headers(dropped: &str) -> Vec<(&'static str, &str)> {
    if dropped.is_empty() {
        Vec::new()
    } else {
        vec![(DROPPED_HEADER, dropped)]
    }
}

/// Submits the translated chat `body` for model group `model` on the
/// admitted target, noting what was left out on the request's record.
pub fn submit(
    worker: &Rc<Ctx>,
    conn: &mut Conn,
    model: &str,
    admitted: Admitted,
    body: Vec<u8>,
    stream: bool,
    dropped: &[String],
) -> Submitted {
    let principal = conn.exchange.api_key.as_ref().map(|k| k.entry.name.clone()).unwrap_or_default();
    let run_req = pb::RunRequest {
        body: body.into(),
        operation: pb::RunOperation::Chat as i32,
        whole: !stream,
        principal,
        session_id: conn.exchange.session_id().to_owned(),
        ..Default::default()
    };
    let key = admitted.lease.key().clone();
    let mut run = dispatch::submit(worker, model, admitted, run_req);
    if let Ok(s) = &mut run {
        s.report_to(&conn.exchange.finish, &key);
    }
    let dropped = dropped.join(", ");
    if !dropped.is_empty() {
        conn.exchange.note_dropped(&dropped);
    }
    Submitted { run, dropped }
}

/// The client's request could not be translated: answered in `d`, never
/// replayed (the client is at fault).
pub async fn refuse(conn: &mut Conn, d: Dialect, invalid: &Invalid, keep: bool, chance: &mut ReplayChance) -> bool {
    chance.commit();
    let msg = invalid.to_string();
    reply::error(&mut conn.responder(), d, invalid.status, &msg, "invalid_request", keep).await
}

async fn collect<A: EventAggregate>(run: &mut RunStream, agg: &mut A) -> Result<(), RunFailure> {
    while let Some(ev) = run.next().await {
        if agg.on_event(ev)? {
            return Ok(());
        }
    }
    Err(ended_without_result())
}

/// Waits for the whole run in `agg` and answers with what `write` makes of
/// it, the `extra` headers beside the dialect's request ids. A failure
/// before that is answered in `d` (or held back for a replay).
#[allow(clippy::too_many_arguments)] // the answer's parts, each used once
pub async fn whole<A: EventAggregate>(
    conn: &mut Conn,
    run: &mut RunStream,
    d: Dialect,
    agg: &mut A,
    write: impl FnOnce(&A, &mut BytesMut),
    extra: &[(&str, &str)],
    keep: bool,
    chance: &mut ReplayChance,
) -> bool {
    let result = {
        let Conn { rd, buf, .. } = &mut *conn;
        with_disconnect_watch::<WHOLE_WATCH, _, _>(rd, buf, std::pin::pin!(collect(run, agg))).await
    };
    match result {
        None => return false,
        // Nothing was written yet: maybe held back for a replay elsewhere.
        Some(Err(f)) => {
            return match chance.hold(f) {
                Some(f) => reply::failure(&mut conn.responder(), d, &f, keep).await,
                None => false,
            }
        }
        Some(Ok(())) => {}
    }
    chance.commit();
    let mut body = BytesMut::new();
    write(agg, &mut body);
    let request_id = run.run_id().to_owned();
    let mut headers = vec![("x-request-id", request_id.as_str())];
    headers.extend(d.request_id_header().map(|h| (h, request_id.as_str())));
    headers.extend_from_slice(extra);
    conn.respond(200, "application/json", &headers, &body, keep).await.is_ok() && keep
}
