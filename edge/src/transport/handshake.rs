//! A node connection before it is a session: its first bytes within the
//! deadline, TLS, a `RegisterRequest` with a configured node's token (and,
//! in managed mode, that node's certificate), the refusals, and the
//! registry's claim on the node that answers the registration.

use std::{net::SocketAddr, rc::Rc, time::Instant};

use bytes::BytesMut;
use iop_core::net::Stream;
use iop_core::{
    limits::LogThrottle,
    rt::{
        frames::{FrameReader, FrameWriter},
        mailbox,
    },
    wire::pb::{self, envelope::Body},
};
use monoio::net::TcpStream;

use crate::{
    ctx::Ctx,
    events::EdgeEvent,
    limits::{failures::Credential, handshakes::HandshakeSlot, tls::TlsTicket},
    link::Arrival,
    mesh::{link_core, CoreMsg},
    node_config::node_payload,
    registry::{Generation, LinkId, RegisterRefusal},
};

use super::envelope;

/// Largest frame accepted before the peer has registered: a
/// RegisterRequest is a few hundred bytes, and an unauthenticated peer must
/// not make the edge buffer `max_frame_bytes`.
pub const PREAUTH_MAX_FRAME: usize = 64 * 1024;

/// One warning (and event) per interval while an address is refused for
/// its failed registrations.
static RATE_LIMITED_LOG: LogThrottle = LogThrottle::new(std::time::Duration::from_secs(10));

/// What a node connection was admitted with at accept.
pub struct Admission {
    /// Its place among the handshakes in progress.
    pub slot: HandshakeSlot,
    /// On a TLS listener, its TLS handshake's place in its address's limits.
    pub tls: Option<TlsTicket>,
}

/// Serves one accepted node connection: reads its `RegisterRequest` and
/// refuses it, or serves it on the core its link belongs on (handing it
/// over when that is another core). Until its token is accepted it may be
/// closed from any core to admit a newcomer (`admission.slot`); after that
/// its slot counts against `node_listener.max_handshakes` until it is
/// ready. Register and ready must both happen within
/// `node_listener.handshake_timeout_sec`.
pub async fn serve(worker: Rc<Ctx>, tcp: TcpStream, peer: SocketAddr, admission: Admission) {
    let close = admission.slot.closed().clone();
    // Boxed: the pre-registration states (TLS among them) stay out of the
    // session's future.
    let arrival = monoio::select! {
        a = Box::pin(preauth(&worker, tcp, peer, admission)) => a,
        _ = close.cancelled() => {
            tracing::debug!(%peer, "unregistered node connection closed to admit a newer one");
            None
        }
    };
    let Some(arrival) = arrival else { return };
    let target = link_core(&arrival.node, arrival.request.link, worker.shared.workers);
    if target == worker.index {
        super::session::serve_arrival(worker, arrival).await;
    } else if let Err(e) = worker.shared.inboxes[target].try_send(CoreMsg::AdoptLink(Box::new(arrival))) {
        // The other core is gone or swamped: serve the link here instead.
        let arrival = match e {
            mailbox::SendError::Full(CoreMsg::AdoptLink(a)) | mailbox::SendError::Closed(CoreMsg::AdoptLink(a)) => a,
            _ => return,
        };
        tracing::debug!(node = %arrival.node, target, "link handover refused; serving it here");
        super::session::serve_arrival(worker, *arrival).await;
    }
}

/// Everything before the connection is a registering link: its first
/// bytes within `node_listener.first_bytes_timeout_ms`, TLS, a
/// `RegisterRequest` with a configured node's token (and, in managed mode,
/// that node's certificate). Refusals are answered (when the peer said
/// something) and closed; None then.
async fn preauth(worker: &Rc<Ctx>, tcp: TcpStream, peer: SocketAddr, admission: Admission) -> Option<Arrival> {
    let Admission { slot, tls: tls_ticket } = admission;
    let _ = tcp.set_nodelay(true);
    let (max_frame, settings) = {
        let cfg = worker.config.borrow();
        (cfg.max_frame_bytes, cfg.node_handshake)
    };
    let deadline = Instant::now() + settings.timeout;
    // A node sends its first frame (or its ClientHello) at once: a silent
    // connection gives its slot back long before the handshake deadline.
    // Readiness only: nothing is read, so nothing is lost when it times out.
    match iop_core::rt::time::timeout(settings.first_bytes_timeout, tcp.readable(false)).await {
        Ok(Ok(())) => slot.spoke(),
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "node connection failed before sending anything");
            return None;
        }
        Err(_) => {
            crate::metrics::conn_limit("node", "first_bytes_timeout");
            tracing::debug!(%peer, "node connection sent nothing in time; closed");
            return None;
        }
    }
    let stream = match &worker.shared.node_tls {
        None => Stream::Plain(tcp),
        // Boxed: only TLS links carry the handshake's state.
        Some(tls) => match iop_core::rt::time::timeout_at(deadline, Box::pin(tls.accept(tcp))).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                // A certificate of another CA, an expired one, none where
                // one is required: counted like a bad token.
                tracing::info!(%peer, error = %e, "node TLS handshake failed");
                let _ = worker.shared.auth.failed(Credential::NodeRegistration, peer.ip());
                worker.shared.events.publish(EdgeEvent::RegistrationRefused {
                    refusal: "tls_handshake",
                    node: String::new(),
                    peer: peer.to_string(),
                });
                return None;
            }
            Err(_) => {
                tracing::info!(%peer, "node TLS handshake timed out");
                return None;
            }
        },
    };
    drop(tls_ticket);
    let mut reader = FrameReader::new(stream, PREAUTH_MAX_FRAME.min(max_frame), BytesMut::new());
    let (correlation_id, request) = first_frame(worker, &mut reader, peer, deadline).await?;
    let (mut stream, leftover) = reader.into_parts();
    // The token first (constant time): a right one never meets the
    // failure limit, whatever else its address did.
    let node = worker.config.borrow().node_by_token(&request.token).map(|n| n.id.clone());
    let Some(node) = node else {
        let resp = unknown_token(worker, peer);
        answer_and_close(&mut stream, correlation_id, resp).await;
        return None;
    };
    if let Some(why) = identity_refusal(worker, &stream, &node) {
        let _ = worker.shared.auth.failed(Credential::NodeRegistration, peer.ip());
        tracing::warn!(%peer, node = %node, reason = %why, "node registration refused");
        worker.shared.events.publish(EdgeEvent::RegistrationRefused {
            refusal: "identity_mismatch",
            node: node.clone(),
            peer: peer.to_string(),
        });
        let resp = refusal(pb::RegisterRefusal::IdentityMismatch, why.to_string());
        answer_and_close(&mut stream, correlation_id, resp).await;
        return None;
    }
    // Proven: never closed for a newcomer from here on. None when it was
    // closed for one an instant ago.
    let handshake = slot.proven()?;
    let stream = match stream.detach() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "could not release a node connection");
            return None;
        }
    };
    Some(Arrival { stream, leftover, request, correlation_id, peer, deadline, handshake, node })
}

/// The answer to a token no node has: counted against the address's
/// failed registrations, or, past that budget, a refusal that says so.
fn unknown_token(worker: &Ctx, peer: SocketAddr) -> pb::RegisterResponse {
    match worker.shared.auth.failed(Credential::NodeRegistration, peer.ip()) {
        Ok(()) => {
            tracing::warn!(%peer, reason = %RegisterRefusal::UnknownToken, "node registration refused");
            worker.shared.events.publish(EdgeEvent::RegistrationRefused {
                refusal: "unknown_token",
                node: String::new(),
                peer: peer.to_string(),
            });
            refusal(pb::RegisterRefusal::UnknownToken, RegisterRefusal::UnknownToken.to_string())
        }
        Err(wait) => {
            if let Some(more) = RATE_LIMITED_LOG.allow() {
                tracing::warn!(%peer, refused_since_last_report = more + 1, "node registration refused: too many failed node registrations from this address");
                worker.shared.events.publish(EdgeEvent::RegistrationRefused {
                    refusal: "too_many_failed_registrations",
                    node: String::new(),
                    peer: peer.to_string(),
                });
            }
            let reason = format!(
                "unknown token, and too many failed node registrations from this address; retry in {} s",
                wait.as_secs().max(1)
            );
            refusal(pb::RegisterRefusal::RateLimited, reason)
        }
    }
}

/// Reads the first frame within `deadline`: a `RegisterRequest`, or the
/// connection is answered (when it said something) and closed.
async fn first_frame(
    worker: &Rc<Ctx>,
    reader: &mut FrameReader<Stream>,
    peer: SocketAddr,
    deadline: Instant,
) -> Option<(u64, pb::RegisterRequest)> {
    // A timeout here ends the connection, so losing a half-read frame is moot.
    let first = match iop_core::rt::time::timeout_at(deadline, reader.next()).await {
        Ok(Ok(Some(env))) => env,
        Ok(Ok(None)) => return None,
        Ok(Err(e)) => {
            tracing::info!(%peer, error = %e, "node connection failed before registering");
            return None;
        }
        Err(_) => {
            tracing::info!(%peer, "node did not register in time");
            return None;
        }
    };
    let cid = first.correlation_id;
    let Some(Body::RegisterRequest(req)) = first.body else {
        tracing::warn!(%peer, "node connection sent something other than RegisterRequest first");
        worker.shared.events.publish(EdgeEvent::RegistrationRefused {
            refusal: "protocol",
            node: String::new(),
            peer: peer.to_string(),
        });
        let resp = refusal(pb::RegisterRefusal::Protocol, "expected RegisterRequest".into());
        answer_and_close(reader.io_mut(), cid, resp).await;
        return None;
    };
    Some((cid, req))
}

/// Writes `resp` to a connection that has no frame writer yet (bounded:
/// a peer that does not read it is not waited for), then drops it.
async fn answer_and_close(stream: &mut Stream, correlation_id: u64, resp: pb::RegisterResponse) {
    let mut out = BytesMut::new();
    if iop_core::wire::encode(&envelope(correlation_id, Body::RegisterResponse(resp)), &mut out, PREAUTH_MAX_FRAME)
        .is_ok()
    {
        let write = monoio::io::AsyncWriteRentExt::write_all(stream, out);
        let _ = iop_core::rt::time::timeout(std::time::Duration::from_secs(1), write).await;
    }
}

/// Claims the node for `link` in the registry and answers the request.
pub(super) fn register(
    worker: &Rc<Ctx>,
    req: &pb::RegisterRequest,
    correlation_id: u64,
    link: LinkId,
    writer: &FrameWriter,
    peer: SocketAddr,
) -> Option<(String, Generation)> {
    let config = worker.config.borrow().clone();
    let claimed = worker.shared.registry.lock().register(&config, &req.token, link, worker.index);
    let (resp, outcome) = match claimed {
        Ok((node_id, generation)) => match config.node(&node_id) {
            Some(entry) => {
                tracing::info!(node = %node_id, generation, link = link.index, links = link.count, %peer, version = %req.node_version, "node registered");
                worker.shared.events.publish(EdgeEvent::NodeRegistered {
                    node: node_id.clone(),
                    generation,
                    peer: peer.to_string(),
                });
                let leases = worker.shared.leases.as_deref();
                let resp = pb::RegisterResponse {
                    accepted: true,
                    reason: String::new(),
                    refusal: pb::RegisterRefusal::None as i32,
                    config: Some(node_payload(entry, worker.revision.get(), leases)),
                    lease_verify_key: leases.map(|l| l.verify_key().into()).unwrap_or_default(),
                    generation,
                    run_event_batches: true,
                };
                (resp, Some((node_id, generation)))
            }
            None => {
                // The registry just matched this id from the same config.
                worker.shared.registry.lock().disconnect(&node_id, generation, link.index);
                tracing::error!(node = %node_id, "registration refused: node config could not be built");
                worker.shared.events.publish(EdgeEvent::RegistrationRefused {
                    refusal: "config_build_failed",
                    node: node_id.clone(),
                    peer: peer.to_string(),
                });
                let resp =
                    refusal(pb::RegisterRefusal::ConfigBuildFailed, "node configuration could not be built".into());
                (resp, None)
            }
        },
        Err(refused) => {
            let (kind, label, node) = match &refused {
                RegisterRefusal::UnknownToken => {
                    let _ = worker.shared.auth.failed(Credential::NodeRegistration, peer.ip());
                    (pb::RegisterRefusal::UnknownToken, "unknown_token", String::new())
                }
                RegisterRefusal::Duplicate(n) => {
                    (pb::RegisterRefusal::DuplicateConnection, "duplicate_connection", n.clone())
                }
                // Refused before the registry is asked (see `identity_refusal`).
                RegisterRefusal::IdentityMismatch(n) => {
                    (pb::RegisterRefusal::IdentityMismatch, "identity_mismatch", n.clone())
                }
            };
            tracing::warn!(%peer, reason = %refused, "node registration refused");
            worker.shared.events.publish(EdgeEvent::RegistrationRefused {
                refusal: label,
                node,
                peer: peer.to_string(),
            });
            (refusal(kind, refused.to_string()), None)
        }
    };
    if writer.send(&envelope(correlation_id, Body::RegisterResponse(resp))).is_err() {
        if let Some((node_id, generation)) = &outcome {
            worker.shared.registry.lock().disconnect(node_id, *generation, link.index);
        }
        return None;
    }
    outcome
}

/// A refused registration's answer.
/// Managed mode (`node_listener.tls.client_ca`): the certificate the link
/// presented (verified against the CA in the handshake) must be issued for
/// `node`, its id as a DNS name among the subject alternative names. So a
/// valid token with another node's certificate is refused, as is a valid
/// certificate with another node's token.
fn identity_refusal(worker: &Ctx, stream: &Stream, node: &str) -> Option<RegisterRefusal> {
    let managed = worker.shared.config.node_tls.as_ref().is_some_and(|t| t.client_ca.is_some());
    if !managed {
        return None;
    }
    let leaf = stream.peer_certificates().and_then(|c| c.into_iter().next());
    let ok = leaf.is_some_and(|c| iop_core::net::tls::names_identity(&c, node));
    (!ok).then(|| RegisterRefusal::IdentityMismatch(node.to_owned()))
}

pub(super) fn refusal(kind: pb::RegisterRefusal, reason: String) -> pb::RegisterResponse {
    pb::RegisterResponse { accepted: false, reason, refusal: kind as i32, ..Default::default() }
}
