//! One node connection: registration, ready gating, run multiplexing,
//! heartbeat, and teardown that fences exactly this generation.

use std::{cell::RefCell, net::SocketAddr, rc::Rc, time::Instant};

use bytes::BytesMut;
use iop_core::net::Stream;
use iop_core::{
    exec::{codes, ExecEvent, FailureSource, RunFailure},
    limits::{LogThrottle, SlotGuard},
    rt::{
        frames::{self, FrameReader, FrameWriter, ReadError},
        mailbox,
        signal::LocalCancel,
    },
    wire::pb::{self, envelope::Body, Envelope},
};
use monoio::net::TcpStream;

use super::{
    runs::{Reception, Routed, RunTable},
    SessionCmd, SESSION_CMD_CAPACITY,
};
use crate::{
    ctx::Ctx,
    events::EdgeEvent,
    limits::{failures::Credential, handshakes::HandshakeSlot, tls::TlsTicket},
    link::{Arrival, NodeRoute},
    mesh::{link_core, CoreMsg},
    node_config::node_payload,
    registry::{DisconnectOutcome, Generation, LinkId, ReadyOutcome, RegisterRefusal},
};

/// Outbound bytes above which run producers would wait (the edge sends little).
const HIGH_WATER: usize = 1024 * 1024;
/// A node that stopped reading this much is disconnected.
const HARD_LIMIT: usize = 64 * 1024 * 1024;
/// Largest frame accepted before the peer has registered: a
/// RegisterRequest is a few hundred bytes, and an unauthenticated peer must
/// not make the edge buffer `max_frame_bytes`.
pub const PREAUTH_MAX_FRAME: usize = 64 * 1024;

/// One warning (and event) per interval while an address is refused for
/// its failed registrations.
static RATE_LIMITED_LOG: LogThrottle = LogThrottle::new(std::time::Duration::from_secs(10));

fn envelope(correlation_id: u64, body: Body) -> Envelope {
    Envelope { correlation_id, body: Some(body) }
}

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
        serve_arrival(worker, arrival).await;
    } else if let Err(e) = worker.shared.inboxes[target].try_send(CoreMsg::AdoptLink(Box::new(arrival))) {
        // The other core is gone or swamped: serve the link here instead.
        let arrival = match e {
            mailbox::SendError::Full(CoreMsg::AdoptLink(a)) | mailbox::SendError::Closed(CoreMsg::AdoptLink(a)) => a,
            _ => return,
        };
        tracing::debug!(node = %arrival.node, target, "link handover refused; serving it here");
        serve_arrival(worker, *arrival).await;
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

/// Serves a registering link on this core to its end.
pub async fn serve_arrival(worker: Rc<Ctx>, arrival: Arrival) {
    let Arrival { stream, leftover, request, correlation_id, peer, deadline, handshake, node: _ } = arrival;
    let stream = match stream.adopt() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "could not adopt a node connection");
            return;
        }
    };
    let max_frame = worker.config.borrow().max_frame_bytes;
    let (rd, wr) = stream.into_split();
    let writer = FrameWriter::new(max_frame, HIGH_WATER, HARD_LIMIT);
    monoio::spawn(writer.clone().run(wr));
    let mut reader = FrameReader::new(rd, PREAUTH_MAX_FRAME.min(max_frame), leftover);
    // A dead or stuck write side ends the session now, not at the next heartbeat.
    let stop_reason = Rc::new(RefCell::new(None));
    {
        let (writer, stop) = (writer.clone(), Stop { stopper: reader.stopper(), reason: stop_reason.clone() });
        monoio::spawn(async move {
            writer.closed().await;
            stop.stop("write_failed");
        });
    }
    let link = LinkId { instance: request.instance, index: request.link, count: request.links.max(1) };
    if worker.shared.leases.is_some() && request.lease_key.len() != 32 {
        // Managed mode seals credentials to the node's key: a node without
        // one (an older build) cannot be given any.
        tracing::warn!(%peer, "node registration refused: managed mode needs the node's lease key");
        let why = "managed mode: the node sent no credential lease key (upgrade the node)".to_owned();
        let _ =
            writer.send(&envelope(correlation_id, Body::RegisterResponse(refusal(pb::RegisterRefusal::Protocol, why))));
        writer.close();
        return;
    }
    let Some((node_id, generation)) = register(&worker, &request, correlation_id, link, &writer, peer) else {
        writer.close();
        return;
    };
    reader.set_max_frame(max_frame);
    // The registration answer carried this revision's config.
    let sent_revision = Rc::new(std::cell::Cell::new(worker.revision.get()));
    let (cmd_tx, cmd_rx) = mailbox::mailbox(SESSION_CMD_CAPACITY);
    let session = Session {
        worker: worker.clone(),
        node_id: node_id.clone(),
        generation,
        link: link.index,
        writer: writer.clone(),
        runs: Rc::new(RefCell::new(RunTable::new(Reception { node: node_id.clone(), generation, link: link.index }))),
        commands: Rc::default(),
        closed: LocalCancel::new(),
        last_seen: Rc::new(std::cell::Cell::new(Instant::now())),
        suspicion: super::Suspicion::default(),
        heard: iop_core::rt::signal::LocalNotify::new(),
        probe_now: iop_core::rt::signal::LocalNotify::new(),
        stop_reason,
        sent_revision: sent_revision.clone(),
        leases: worker.shared.leases.clone().map(|issuer| {
            Rc::new(crate::credentials::LinkCredentials {
                issuer,
                config: worker.config.clone(),
                node: node_id.clone(),
                generation,
                recipient: request.lease_key.to_vec(),
                sent_revision,
            })
        }),
    };
    let reason = session.run(&mut reader, cmd_tx, cmd_rx, deadline, handshake).await;
    session.teardown(reason).await;
}

/// Claims the node for `link` in the registry and answers the request.
fn register(
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

fn refusal(kind: pb::RegisterRefusal, reason: String) -> pb::RegisterResponse {
    pb::RegisterResponse { accepted: false, reason, refusal: kind as i32, ..Default::default() }
}

struct Session {
    worker: Rc<Ctx>,
    node_id: String,
    generation: Generation,
    /// This link's index among the node's links.
    link: u32,
    writer: FrameWriter,
    runs: Rc<RefCell<RunTable>>,
    commands: Rc<super::commands::PendingCommands>,
    closed: LocalCancel,
    last_seen: Rc<std::cell::Cell<Instant>>,
    /// Set while the link does not answer (see `suspect.rs`).
    suspicion: super::Suspicion,
    /// Told of a frame while the link is suspect.
    heard: iop_core::rt::signal::LocalNotify,
    /// Asks the watch to probe now (`SessionCmd::Probe`).
    probe_now: iop_core::rt::signal::LocalNotify,
    /// Why the session stopped its own reader (heartbeat timeout, close command).
    stop_reason: Rc<RefCell<Option<String>>>,
    /// The config revision last sent to the node on this link.
    sent_revision: Rc<std::cell::Cell<u64>>,
    /// Managed mode: seals each run's credential.
    leases: Option<Rc<crate::credentials::LinkCredentials>>,
}

impl Session {
    /// Serves frames until the connection ends; returns the close reason.
    async fn run<R>(
        &self,
        reader: &mut FrameReader<R>,
        cmd_tx: mailbox::Sender<SessionCmd>,
        cmd_rx: mailbox::Receiver<SessionCmd>,
        handshake_deadline: Instant,
        handshake: SlotGuard,
    ) -> String
    where
        R: monoio::io::CancelableAsyncReadRent,
    {
        monoio::spawn(pump_commands(
            cmd_rx,
            Pumped {
                runs: self.runs.clone(),
                commands: self.commands.clone(),
                writer: self.writer.clone(),
                closed: self.closed.clone(),
                stop: Stop { stopper: reader.stopper(), reason: self.stop_reason.clone() },
                sent_revision: self.sent_revision.clone(),
                leases: self.leases.clone(),
                probe_now: self.probe_now.clone(),
            },
        ));
        let timing = self.worker.config.borrow().testing;
        monoio::spawn(heartbeat(
            timing,
            self.writer.clone(),
            self.last_seen.clone(),
            self.closed.clone(),
            Stop { stopper: reader.stopper(), reason: self.stop_reason.clone() },
            self.node_id.clone(),
        ));
        {
            let runs = self.runs.clone();
            monoio::spawn(super::suspect::watch(super::suspect::Watch {
                worker: self.worker.clone(),
                node_id: self.node_id.clone(),
                generation: self.generation,
                link: self.link,
                probe: self.worker.config.borrow().link_probe,
                writer: self.writer.clone(),
                last_seen: self.last_seen.clone(),
                heard: self.heard.clone(),
                probe_now: self.probe_now.clone(),
                suspicion: self.suspicion.clone(),
                closed: self.closed.clone(),
                owes: Box::new(move || !runs.borrow().is_empty()),
            }));
        }
        let mut cmd_tx = Some(cmd_tx);
        let mut ready = false;
        let mut since_yield = 0u32;
        let mut yielded_at = reader.decoded_bytes();
        // A registered connection that never reports ready would hold the
        // node's registration (refusing every reconnect) forever.
        let became_ready = Rc::new(std::cell::Cell::new(false));
        let mut handshake = Some(handshake);
        {
            let (flag, closed) = (became_ready.clone(), self.closed.clone());
            let stop = Stop { stopper: reader.stopper(), reason: self.stop_reason.clone() };
            monoio::spawn(async move {
                monoio::select! {
                    _ = monoio::time::sleep_until(handshake_deadline.into()) => {}
                    _ = closed.cancelled() => return,
                }
                if !flag.get() {
                    stop.stop("ready_timeout");
                }
            });
        }
        loop {
            let env = match reader.next().await {
                Ok(Some(env)) => env,
                Ok(None) => return "closed_by_node".into(),
                Err(ReadError::Cancelled) => {
                    return self.stop_reason.borrow_mut().take().unwrap_or_else(|| "stopped".into())
                }
                Err(e) => return format!("read_error: {e}"),
            };
            self.last_seen.set(Instant::now());
            if self.suspicion.is_suspect() {
                self.heard.notify();
            }
            since_yield += 1;
            // Reads that find data ready do not await (on epoll at all): a
            // busy link must still let this core's clients drain their runs,
            // after a number of frames or of bytes, whichever comes first.
            if since_yield >= super::FRAMES_PER_YIELD || reader.decoded_bytes() - yielded_at >= super::BYTES_PER_YIELD {
                since_yield = 0;
                yielded_at = reader.decoded_bytes();
                iop_core::rt::yield_now().await;
            }
            let cid = env.correlation_id;
            match env.body {
                Some(Body::NodeReadyRequest(req)) => {
                    let ok = self.on_ready(&req, &mut cmd_tx).await;
                    ready |= ok;
                    became_ready.set(ready);
                    if ready {
                        // The handshake is over: this connection no longer counts against it.
                        handshake.take();
                    }
                    let resp = pb::NodeReadyResponse {
                        ready: ok,
                        reason: if ok { String::new() } else { "stale or unknown connection".into() },
                    };
                    let _ = self.writer.send(&envelope(cid, Body::NodeReadyResponse(resp)));
                    if ok {
                        self.push_config_if_stale(req.config_revision);
                    }
                }
                Some(Body::RunEvent(ev)) if ready => self.on_run_event(ev),
                Some(Body::ProviderTunnelFrame(frame)) if ready => self.on_tunnel_frame(frame),
                Some(Body::NodeDraining(d)) if ready => {
                    // Fence new work now; runs in flight finish on their links.
                    tracing::info!(node = %self.node_id, generation = self.generation, link = self.link, reason = %d.reason, "node draining");
                    self.worker.shared.registry.lock().drain(&self.node_id, self.generation);
                    let (node_id, generation) = (self.node_id.clone(), self.generation);
                    self.worker.shared.broadcast(|| CoreMsg::NodeGone { node_id: node_id.clone(), generation }).await;
                    self.worker.shared.events.publish(EdgeEvent::NodeDraining { node: node_id, generation });
                }
                Some(Body::Heartbeat(hb)) => {
                    if hb.ping {
                        let pong = pb::Heartbeat { ping: false, sent_at_ms: hb.sent_at_ms };
                        let _ = self.writer.send(&envelope(cid, Body::Heartbeat(pong)));
                    }
                }
                Some(Body::ConfigRefreshAck(ack)) => {
                    tracing::info!(node = %self.node_id, revision = ack.revision, applied = ack.applied, error = %ack.error, "node config refresh acknowledged");
                }
                Some(Body::NodeCommandResponse(resp)) => {
                    if !self.commands.answer(cid, resp) {
                        tracing::debug!(node = %self.node_id, cid, "response to no waiting command ignored");
                    }
                }
                other => {
                    let what = other.as_ref().map(body_name).unwrap_or("empty");
                    return format!("protocol_violation: unexpected {what}");
                }
            }
            if self.writer.is_closed() {
                return "write_failed".into();
            }
        }
    }

    async fn on_ready(&self, req: &pb::NodeReadyRequest, cmd_tx: &mut Option<mailbox::Sender<SessionCmd>>) -> bool {
        if req.node_id != self.node_id {
            tracing::warn!(node = %self.node_id, claimed = %req.node_id, "ready for another node id refused");
            return false;
        }
        let Some(session) = cmd_tx.clone() else { return true };
        let handle = super::LinkHandle { session: session.clone(), suspicion: self.suspicion.clone() };
        let outcome = self.worker.shared.registry.lock().ready(&self.node_id, self.generation, self.link, handle);
        match outcome {
            ReadyOutcome::BecameReady(set) | ReadyOutcome::LinkReady(set) => {
                let first = set.links.len() == 1;
                cmd_tx.take();
                self.worker
                    .local_sessions
                    .borrow_mut()
                    .insert((self.node_id.clone(), self.link), (self.generation, session));
                self.publish_route(set).await;
                if first {
                    tracing::info!(node = %self.node_id, generation = self.generation, link = self.link, "node ready");
                    self.worker
                        .shared
                        .events
                        .publish(EdgeEvent::NodeReady { node: self.node_id.clone(), generation: self.generation });
                } else {
                    tracing::info!(node = %self.node_id, generation = self.generation, link = self.link, "node link ready");
                }
                true
            }
            ReadyOutcome::AlreadyReady => true,
            ReadyOutcome::Stale => {
                tracing::warn!(node = %self.node_id, generation = self.generation, link = self.link, "stale ready refused");
                false
            }
        }
    }

    /// Tells every core the node's ready links now (unless it is draining).
    async fn publish_route(&self, set: crate::registry::LinkSet<super::LinkHandle>) {
        if set.draining || set.links.is_empty() {
            return;
        }
        let route = NodeRoute::new(self.generation, set);
        let node_id = self.node_id.clone();
        self.worker.shared.broadcast(|| CoreMsg::NodeReady { node_id: node_id.clone(), route: route.clone() }).await;
    }

    /// A reload committed between registration and ready leaves the node on
    /// the config it registered with: push the current one (after the ready
    /// response, which the node waits for first).
    fn push_config_if_stale(&self, node_revision: u64) {
        let revision = self.worker.revision.get();
        if node_revision == revision {
            return;
        }
        let entry = self.worker.config.borrow().node(&self.node_id).cloned();
        if let Some(entry) = entry {
            let payload = node_payload(&entry, revision, self.worker.shared.leases.as_deref());
            let refresh = pb::ConfigRefresh { config: Some(payload) };
            if self.writer.send(&envelope(revision, Body::ConfigRefresh(refresh))).is_ok() {
                self.sent_revision.set(revision);
            }
        }
    }

    fn on_run_event(&self, mut ev: pb::RunEvent) {
        // The id stays a slice of the frame (no allocation per token); one
        // that is not UTF-8 names no run.
        let raw_id = std::mem::take(&mut ev.run_id);
        let Ok(run_id) = std::str::from_utf8(&raw_id) else {
            tracing::warn!(node = %self.node_id, "run event with a malformed run id ignored");
            return;
        };
        let seq = ev.seq;
        let Some(event) = ExecEvent::from_wire(ev) else {
            tracing::warn!(node = %self.node_id, run = %run_id, "run event without a kind ignored");
            return;
        };
        let routed = self.runs.borrow_mut().route(run_id, seq, event);
        if let Routed::CancelOnNode(reason) = routed {
            send_cancel(&self.writer, run_id.to_owned(), reason);
        }
    }

    fn on_tunnel_frame(&self, frame: pb::ProviderTunnelFrame) {
        let (id, routed) = self.runs.borrow_mut().route_tunnel_frame(frame);
        if let Routed::CancelOnNode(reason) = routed {
            send_cancel(&self.writer, String::from_utf8_lossy(&id).into_owned(), reason);
        }
    }

    async fn teardown(self, reason: String) {
        self.closed.cancel();
        {
            let mut local = self.worker.local_sessions.borrow_mut();
            let key = (self.node_id.clone(), self.link);
            if local.get(&key).is_some_and(|(g, _)| *g == self.generation) {
                local.remove(&key);
            }
        }
        let outcome = self.worker.shared.registry.lock().disconnect(&self.node_id, self.generation, self.link);
        // Fence first, then fail the runs: their leases are released after
        // the fence reaches each owner core (inboxes are FIFO), so freed
        // capacity is never handed to a waiter on this dead connection.
        // When other links of the generation live on, they take the node's
        // new runs from here on; this link's runs fail.
        let current = match outcome {
            DisconnectOutcome::Current { was_ready } => {
                if was_ready {
                    let (node_id, generation) = (self.node_id.clone(), self.generation);
                    self.worker.shared.broadcast(|| CoreMsg::NodeGone { node_id: node_id.clone(), generation }).await;
                }
                true
            }
            DisconnectOutcome::LinkGone(set) => {
                self.publish_route(set).await;
                false
            }
            DisconnectOutcome::Stale => false,
        };
        let failure = RunFailure::new(
            codes::NODE_DISCONNECTED,
            502,
            FailureSource::Node,
            format!("node `{}` disconnected ({reason})", self.node_id),
        )
        .retryable();
        let in_flight = self.runs.borrow().len();
        self.runs.borrow_mut().fail_all(&failure, current);
        if current {
            tracing::info!(node = %self.node_id, generation = self.generation, link = self.link, %reason, in_flight, "node disconnected");
        } else {
            tracing::info!(node = %self.node_id, generation = self.generation, link = self.link, %reason, in_flight, "node link ended");
        }
        self.worker.shared.events.publish(EdgeEvent::NodeDisconnected {
            node: self.node_id.clone(),
            generation: self.generation,
            link: self.link,
            reason,
            current,
        });
        self.writer.close();
    }
}

fn send_cancel(writer: &FrameWriter, run_id: String, reason: &str) {
    let req = pb::CancelRequest {
        kind: pb::CancelKind::CancelRun as i32,
        run_id,
        reason: reason.to_owned(),
        ..Default::default()
    };
    let _ = writer.send(&envelope(0, Body::CancelRequest(req)));
}

/// What the command pump of a session works with.
struct Pumped {
    runs: Rc<RefCell<RunTable>>,
    commands: Rc<super::commands::PendingCommands>,
    writer: FrameWriter,
    closed: LocalCancel,
    stop: Stop,
    sent_revision: Rc<std::cell::Cell<u64>>,
    leases: Option<Rc<crate::credentials::LinkCredentials>>,
    probe_now: iop_core::rt::signal::LocalNotify,
}

/// Applies commands from any core to this session until it closes.
async fn pump_commands(rx: mailbox::Receiver<SessionCmd>, p: Pumped) {
    let Pumped { runs, commands, writer, closed, stop, sent_revision, leases, probe_now } = p;
    loop {
        let cmd = monoio::select! {
            cmd = rx.recv() => cmd,
            _ = closed.cancelled() => None,
        };
        let Some(cmd) = cmd else { break };
        match cmd {
            SessionCmd::Run { mut req, events, lease } => {
                if let Some(l) = &leases {
                    l.seal_run(&mut req, &lease);
                }
                runs.borrow_mut().insert(req.run_id.clone(), events, Some(lease));
                let env = envelope(0, Body::RunRequest(*req));
                if writer.send(&env).is_err() {
                    break;
                }
                // The target moves from the sent request to the entry (no copy).
                if let Some(Body::RunRequest(r)) = env.body {
                    runs.borrow_mut().set_target(&r.run_id, r.target);
                }
            }
            SessionCmd::Tunnel { mut req, events, lease } => {
                if let Some(l) = &leases {
                    l.seal_tunnel(&mut req, &lease);
                }
                let tunnel_id = req.tunnel_id.clone();
                runs.borrow_mut().insert_tunnel(tunnel_id, events, Some(lease));
                if writer.send_tunnel_request(&req).is_err() {
                    break;
                }
                runs.borrow_mut().set_target(&req.tunnel_id, req.target);
            }
            SessionCmd::Credit { id, bytes } => {
                if runs.borrow().contains(&id) {
                    let credit = pb::StreamCredit { id, bytes };
                    let _ = writer.send(&envelope(0, Body::StreamCredit(credit)));
                }
            }
            SessionCmd::Cancel { run_id, reason } => {
                if runs.borrow_mut().remove(&run_id) {
                    send_cancel(&writer, run_id, reason);
                }
            }
            SessionCmd::Command { req, reply } => {
                // Too many waiting: dropping `reply` tells the caller.
                if let Some(id) = commands.register(reply) {
                    if writer.send(&envelope(id, Body::NodeCommandRequest(req))).is_err() {
                        commands.forget(id);
                        break;
                    }
                }
            }
            SessionCmd::Refresh { payload } => {
                let revision = payload.revision;
                let refresh = pb::ConfigRefresh { config: Some(payload) };
                if writer.send(&envelope(revision, Body::ConfigRefresh(refresh))).is_err() {
                    break;
                }
                sent_revision.set(revision);
            }
            SessionCmd::Probe => probe_now.notify(),
            SessionCmd::Close { reason } => {
                stop.stop(reason);
                break;
            }
        }
    }
    // Commands still queued belong to a dead session: fail their runs now.
    drop(rx_fail_remaining(rx));
}

fn rx_fail_remaining(rx: mailbox::Receiver<SessionCmd>) -> mailbox::Receiver<SessionCmd> {
    let failure =
        RunFailure::new(codes::NODE_DISCONNECTED, 502, FailureSource::Node, "node connection closed").retryable();
    while let Some(cmd) = rx.try_recv() {
        match cmd {
            SessionCmd::Run { events, .. } => events.send_terminal(ExecEvent::Error(failure.clone())),
            SessionCmd::Tunnel { events, .. } => {
                events.send_terminal(iop_core::tunnel::TunnelItem::Error(failure.clone()))
            }
            _ => {}
        }
    }
    rx
}

/// Ends the session's reader with a reason.
struct Stop {
    stopper: iop_core::rt::frames::ReadStopper,
    reason: Rc<RefCell<Option<String>>>,
}

impl Stop {
    fn stop(&self, reason: impl Into<String>) {
        self.reason.borrow_mut().get_or_insert_with(|| reason.into());
        self.stopper.stop();
    }
}

/// Pings the node and closes the connection when it falls silent.
async fn heartbeat(
    timing: iop_core::config::TestingSettings,
    writer: FrameWriter,
    last_seen: Rc<std::cell::Cell<Instant>>,
    closed: LocalCancel,
    stop: Stop,
    node_id: String,
) {
    if frames::heartbeat(timing, &writer, &last_seen, &closed).await == frames::Liveness::Silent {
        tracing::warn!(node = %node_id, "node silent beyond the heartbeat wait; closing (heartbeat_timeout)");
        stop.stop("heartbeat_timeout");
    }
}

fn body_name(b: &Body) -> &'static str {
    match b {
        Body::RegisterRequest(_) => "RegisterRequest",
        Body::RegisterResponse(_) => "RegisterResponse",
        Body::NodeReadyRequest(_) => "NodeReadyRequest",
        Body::NodeReadyResponse(_) => "NodeReadyResponse",
        Body::NodeDraining(_) => "NodeDraining before ready",
        Body::RunRequest(_) => "RunRequest",
        Body::RunEvent(_) => "RunEvent before ready",
        Body::CancelRequest(_) => "CancelRequest",
        Body::NodeCommandRequest(_) => "NodeCommandRequest",
        Body::NodeCommandResponse(_) => "NodeCommandResponse",
        Body::ProviderTunnelRequest(_) => "ProviderTunnelRequest",
        Body::ProviderTunnelFrame(_) => "ProviderTunnelFrame",
        Body::ConfigRefresh(_) => "ConfigRefresh",
        Body::ConfigRefreshAck(_) => "ConfigRefreshAck",
        Body::Heartbeat(_) => "Heartbeat",
        Body::StreamCredit(_) => "StreamCredit",
    }
}
