//! One registered node connection: ready gating, run multiplexing,
//! heartbeat, and teardown that fences exactly this generation.

use std::{cell::RefCell, rc::Rc, time::Instant};

use iop_core::{
    exec::{codes, ExecEvent, FailureSource, RunFailure},
    limits::SlotGuard,
    rt::{
        frames::{self, FrameReader, FrameWriter, ReadError},
        mailbox,
        signal::LocalCancel,
    },
    wire::{
        pb::{self, envelope::Body},
        Frame, RunFrame,
    },
};

use super::{
    envelope,
    handshake::{refusal, register, PREAUTH_MAX_FRAME},
    pump::{pump_commands, send_cancel, Pumped},
    runs::{Reception, Routed, RunTable},
    SessionCmd, SESSION_CMD_CAPACITY,
};
use crate::{
    ctx::Ctx,
    events::EdgeEvent,
    link::{Arrival, NodeRoute},
    mesh::CoreMsg,
    node_config::node_payload,
    registry::{DisconnectOutcome, Generation, LinkId, ReadyOutcome},
};

/// Outbound bytes above which run producers would wait (the edge sends little).
const HIGH_WATER: usize = 1024 * 1024;
/// A node that stopped reading this much is disconnected.
const HARD_LIMIT: usize = 64 * 1024 * 1024;

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
        workspace: Rc::default(),
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

struct Session {
    worker: Rc<Ctx>,
    node_id: String,
    generation: Generation,
    /// This link's index among the node's links.
    link: u32,
    writer: FrameWriter,
    runs: Rc<RefCell<RunTable>>,
    commands: Rc<super::commands::PendingCommands>,
    /// Workspace calls waiting for the node's answer.
    workspace: Rc<super::commands::PendingWorkspace>,
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
                workspace: self.workspace.clone(),
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
            let frame = match reader.next_frame().await {
                Ok(Some(frame)) => frame,
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
            let env = match frame {
                Frame::Envelope(env) => env,
                Frame::Run(run) if ready => {
                    self.on_run_frame(&run);
                    if self.writer.is_closed() {
                        return "write_failed".into();
                    }
                    continue;
                }
                Frame::Run(_) => return "protocol_violation: unexpected run events before ready".into(),
            };
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
                        if req.shares.is_some() {
                            super::shares::report(&self.worker, &self.writer, &self.node_id, self.generation);
                        }
                        self.push_config_if_stale(req.config_revision);
                    }
                }
                Some(Body::RunEvent(ev)) if ready => self.on_run_event(ev),
                Some(Body::RunEvents(batch)) if ready => self.on_run_events(batch),
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
                // Before ready (a refused ready) there is nothing to apply it to.
                Some(Body::CapacityShares(shares)) => {
                    if ready && super::shares::apply(&self.worker, &self.node_id, self.generation, &shares) {
                        super::shares::report(&self.worker, &self.writer, &self.node_id, self.generation);
                    }
                }
                Some(Body::ConfigRefreshAck(ack)) => {
                    tracing::info!(node = %self.node_id, revision = ack.revision, applied = ack.applied, error = %ack.error, "node config refresh acknowledged");
                    if ack.applied {
                        // The refreshed catalog, as the node checked it again.
                        let refused = ack.refused_workspaces.into_iter().map(|r| r.workspace_ref).collect();
                        self.worker.shared.workspaces.record(&self.node_id, self.generation, refused);
                    }
                }
                Some(Body::NodeCommandResponse(resp)) => {
                    if !self.commands.answer(cid, resp) {
                        tracing::debug!(node = %self.node_id, cid, "response to no waiting command ignored");
                    }
                }
                Some(body) if ready && is_workspace_answer(&body) => {
                    if let Some(answer) = iop_core::wire::WorkspaceAnswer::from_body(body) {
                        if !self.workspace.answer(cid, answer) {
                            tracing::debug!(node = %self.node_id, cid, "workspace answer to no waiting call ignored");
                        }
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
        // Every link says it; the first one is logged.
        for r in req.refused_workspaces.iter().filter(|_| self.link == 0) {
            let reason = pb::WorkspaceRefusalReason::try_from(r.reason).map_or("unknown", |r| r.as_str_name());
            tracing::warn!(node = %self.node_id, link = self.link, workspace = %r.workspace_ref, reason, "node serves no request in this workspace");
        }
        let refused = req.refused_workspaces.iter().map(|r| r.workspace_ref.clone()).collect();
        self.worker.shared.workspaces.record(&self.node_id, self.generation, refused);
        // A node of several edges: this edge's shares are in force before
        // any core sees the node ready (same core, earlier messages).
        // (Acknowledged after the ready response, which the node awaits first.)
        if let Some(shares) = &req.shares {
            super::shares::apply(&self.worker, &self.node_id, self.generation, shares);
            monoio::spawn(super::shares::keep_reporting(
                self.worker.clone(),
                self.writer.clone(),
                self.node_id.clone(),
                self.generation,
                self.closed.clone(),
            ));
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

    fn on_run_events(&self, batch: pb::RunEvents) {
        let Ok(run_id) = std::str::from_utf8(&batch.run_id) else {
            tracing::warn!(node = %self.node_id, "run events with a malformed run id ignored");
            return;
        };
        let routed = self.runs.borrow_mut().route_batch(run_id, batch.seq, batch.events);
        if let Routed::CancelOnNode(reason) = routed {
            send_cancel(&self.writer, run_id.to_owned(), reason);
        }
    }

    /// A run's events as their frame brought them (the common shapes):
    /// routed as slices of it, nothing decoded or allocated first.
    fn on_run_frame(&self, run: &RunFrame) {
        let Ok(run_id) = std::str::from_utf8(&run.run_id) else {
            tracing::warn!(node = %self.node_id, "run events with a malformed run id ignored");
            return;
        };
        let routed = self.runs.borrow_mut().route_batch(run_id, run.seq, run.events());
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

/// Ends the session's reader with a reason.
pub(super) struct Stop {
    stopper: iop_core::rt::frames::ReadStopper,
    reason: Rc<RefCell<Option<String>>>,
}

impl Stop {
    pub(super) fn stop(&self, reason: impl Into<String>) {
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

fn is_workspace_answer(b: &Body) -> bool {
    matches!(
        b,
        Body::WorkspaceOpenResponse(_)
            | Body::WorkspaceToolResponse(_)
            | Body::WorkspaceArtifactResponse(_)
            | Body::WorkspaceCancelResponse(_)
            | Body::WorkspaceCleanupResponse(_)
    )
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
        Body::RunEvents(_) => "RunEvents before ready",
        Body::CancelRequest(_) => "CancelRequest",
        Body::NodeCommandRequest(_) => "NodeCommandRequest",
        Body::NodeCommandResponse(_) => "NodeCommandResponse",
        Body::ProviderTunnelRequest(_) => "ProviderTunnelRequest",
        Body::ProviderTunnelFrame(_) => "ProviderTunnelFrame",
        Body::ConfigRefresh(_) => "ConfigRefresh",
        Body::ConfigRefreshAck(_) => "ConfigRefreshAck",
        Body::Heartbeat(_) => "Heartbeat",
        Body::CapacityShares(_) => "CapacityShares",
        Body::ShareDemand(_) => "ShareDemand",
        Body::StreamCredit(_) => "StreamCredit",
        Body::WorkspaceOpenRequest(_) => "WorkspaceOpenRequest",
        Body::WorkspaceToolRequest(_) => "WorkspaceToolRequest",
        Body::WorkspaceArtifactRequest(_) => "WorkspaceArtifactRequest",
        Body::WorkspaceCancelRequest(_) => "WorkspaceCancelRequest",
        Body::WorkspaceCleanupRequest(_) => "WorkspaceCleanupRequest",
        Body::WorkspaceOpenResponse(_) => "WorkspaceOpenResponse before ready",
        Body::WorkspaceToolResponse(_) => "WorkspaceToolResponse before ready",
        Body::WorkspaceArtifactResponse(_) => "WorkspaceArtifactResponse before ready",
        Body::WorkspaceCancelResponse(_) => "WorkspaceCancelResponse before ready",
        Body::WorkspaceCleanupResponse(_) => "WorkspaceCleanupResponse before ready",
    }
}
