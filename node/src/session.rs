//! One connection to the edge: register, apply the config, report ready,
//! then serve runs until the connection ends.

use std::{
    cell::Cell,
    rc::Rc,
    time::{Duration, Instant},
};

use bytes::BytesMut;
use iop_core::net::Stream;
use iop_core::{
    config::NodeConfig,
    rt::{
        blocking,
        frames::{self, FrameReader, FrameWriter, ReadError, ReadStopper},
        signal::LocalCancel,
    },
    wire::pb::{self, envelope::Body, Envelope},
};
use monoio::net::TcpStream;

use crate::{
    adapter::Adapter,
    process::LinkSpec,
    run::RunManager,
    upstream::{ClientConfig, UpstreamClient},
};

/// Run events may buffer this much before adapters wait for the socket.
const HIGH_WATER: usize = 1024 * 1024;
/// An edge that stopped reading this much is disconnected.
const HARD_LIMIT: usize = 256 * 1024 * 1024;
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// How a session ended.
#[derive(Debug)]
pub enum SessionEnd {
    /// Local shutdown: exit normally.
    Shutdown,
    /// Cannot succeed by retrying (unknown token, invalid config).
    Fatal(String),
    /// Retry with the reconnect policy; `established` if the node had been ready.
    Retry {
        /// The node reached ready on this connection.
        established: bool,
        /// Why it ended.
        reason: String,
    },
}

fn envelope(correlation_id: u64, body: Body) -> Envelope {
    Envelope { correlation_id, body: Some(body) }
}

fn retry(reason: impl Into<String>) -> SessionEnd {
    SessionEnd::Retry { established: false, reason: reason.into() }
}

/// Connects `link`, registers and serves until the connection ends or
/// `shutdown` is raised.
pub async fn run(cfg: &NodeConfig, link: &LinkSpec, shutdown: &LocalCancel) -> SessionEnd {
    let edge = &*link.edge;
    let addrs = match blocking::resolve(edge.to_owned()).await {
        Ok(a) if !a.is_empty() => a,
        Ok(_) => return retry(format!("edge address {edge} resolved to nothing")),
        Err(e) => return retry(format!("cannot resolve edge address {edge}: {e}")),
    };
    let mut last_err = String::new();
    let mut stream = None;
    for addr in addrs {
        let attempt = monoio::select! {
            r = iop_core::rt::time::timeout(CONNECT_TIMEOUT, TcpStream::connect_addr(addr)) => r,
            _ = shutdown.cancelled() => return SessionEnd::Shutdown,
        };
        match attempt {
            Ok(Ok(s)) => {
                stream = Some(s);
                break;
            }
            Ok(Err(e)) => last_err = format!("cannot connect to edge {addr}: {e}"),
            Err(_) => last_err = format!("connecting to edge {addr} timed out"),
        }
    }
    let Some(tcp) = stream else { return retry(last_err) };
    let _ = tcp.set_nodelay(true);
    let stream = match &link.tls {
        None => Stream::Plain(tcp),
        Some(tls) => {
            let name = cfg.edge_tls.as_ref().and_then(|t| t.server_name.clone()).unwrap_or_else(|| edge_host(edge));
            let handshake = monoio::select! {
                r = iop_core::rt::time::timeout(HANDSHAKE_TIMEOUT, tls.connect(tcp, &name)) => r,
                _ = shutdown.cancelled() => return SessionEnd::Shutdown,
            };
            match handshake {
                Ok(Ok(s)) => s,
                // A certificate the node does not trust will not change by
                // retrying at once, but may by a renewal: retried.
                Ok(Err(e)) => return retry(format!("TLS handshake with edge {edge} failed: {e}")),
                Err(_) => return retry(format!("TLS handshake with edge {edge} timed out")),
            }
        }
    };
    let (rd, wr) = stream.into_split();
    let writer = FrameWriter::new(cfg.max_frame_bytes, HIGH_WATER, HARD_LIMIT);
    monoio::spawn(writer.clone().run(wr));
    let mut reader = FrameReader::new(rd, cfg.max_frame_bytes, BytesMut::new());
    // A dead or stuck write side ends the session now, not at the next heartbeat.
    {
        let (writer, stopper) = (writer.clone(), reader.stopper());
        monoio::spawn(async move {
            writer.closed().await;
            stopper.stop();
        });
    }
    let end = serve(cfg, link, shutdown, &writer, &mut reader).await;
    writer.close();
    end
}

/// The host of a `host:port` edge address (brackets of an IPv6 one off).
fn edge_host(edge: &str) -> String {
    let host = edge.rsplit_once(':').map_or(edge, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']').to_owned()
}

async fn next_frame<R: monoio::io::CancelableAsyncReadRent>(
    reader: &mut FrameReader<R>,
    shutdown: &LocalCancel,
    what: &str,
) -> Result<Envelope, SessionEnd> {
    // A handshake timeout or shutdown ends the connection, so losing a
    // half-read frame is moot.
    let read = monoio::select! {
        r = iop_core::rt::time::timeout(HANDSHAKE_TIMEOUT, reader.next()) => r,
        _ = shutdown.cancelled() => return Err(SessionEnd::Shutdown),
    };
    match read {
        Ok(Ok(Some(env))) => Ok(env),
        Ok(Ok(None)) => Err(retry(format!("edge closed the connection while waiting for {what}"))),
        Ok(Err(e)) => Err(retry(format!("connection failed while waiting for {what}: {e}"))),
        Err(_) => Err(retry(format!("edge did not send {what} in time"))),
    }
}

async fn serve<R: monoio::io::CancelableAsyncReadRent>(
    cfg: &NodeConfig,
    link: &LinkSpec,
    shutdown: &LocalCancel,
    writer: &FrameWriter,
    reader: &mut FrameReader<R>,
) -> SessionEnd {
    let register = pb::RegisterRequest {
        token: cfg.token.expose().to_owned(),
        node_version: env!("CARGO_PKG_VERSION").to_owned(),
        instance: link.instance,
        link: link.index,
        links: link.count,
        lease_key: link.leases.public_key().to_vec().into(),
    };
    if writer.send(&envelope(1, Body::RegisterRequest(register))).is_err() {
        return retry("connection closed before registering");
    }
    let resp = match next_frame(reader, shutdown, "RegisterResponse").await {
        Ok(env) => match env.body {
            Some(Body::RegisterResponse(r)) => r,
            _ => return retry("edge answered registration with an unexpected frame"),
        },
        Err(end) => return end,
    };
    if !resp.accepted {
        return match pb::RegisterRefusal::try_from(resp.refusal) {
            Ok(pb::RegisterRefusal::UnknownToken) => {
                SessionEnd::Fatal(format!("edge refused the registration: {} (check the node token)", resp.reason))
            }
            Ok(pb::RegisterRefusal::IdentityMismatch) => SessionEnd::Fatal(format!(
                "edge refused the registration: {} (edge_tls.cert must be issued for this node's id)",
                resp.reason
            )),
            Ok(pb::RegisterRefusal::ConfigBuildFailed) => {
                SessionEnd::Fatal(format!("edge could not build this node's config: {}", resp.reason))
            }
            _ => retry(format!("edge refused the registration: {}", resp.reason)),
        };
    }
    let Some(payload) = resp.config else {
        return SessionEnd::Fatal("edge accepted the registration but sent no config".into());
    };
    let adapters = match build_adapters(&payload, cfg.stream_coalesce) {
        Ok(a) => a,
        Err(e) => return SessionEnd::Fatal(format!("invalid provider config from the edge: {e}")),
    };
    let node_id = payload.node_id.clone();
    set_long_capacities(link, &payload);
    let manager = RunManager::new(adapters, link.gates.clone(), writer.clone());
    manager.set_edge(link.edge_index, link.shares.clone());
    manager.set_batches(resp.run_event_batches);
    if let Some(store) = &link.store {
        manager.set_store(store.clone());
    }
    if !resp.lease_verify_key.is_empty() {
        // Managed mode: provider credentials come with each run, sealed.
        let leases = crate::run::lease::NodeLeases::new(
            link.leases.clone(),
            resp.lease_verify_key.to_vec(),
            resp.generation,
            &payload,
        );
        manager.set_leases(leases);
    }

    // Before ready: a workspace it cannot honour is said so, and served by none.
    let (catalog, refused_workspaces) = crate::workspace::admit(payload.workspaces.clone(), link.index == 0).await;
    // The process's links share one state: the latest admission wins.
    link.workspaces.install(catalog.entries());
    // A node of several edges joins the share table now: its ready says
    // this edge's shares, in force from the first admission.
    let (membership, shares) = match &link.shares {
        Some(table) => {
            let (tx, rx) = iop_core::rt::mailbox::mailbox(8);
            let (m, mine) = table.join(link.edge_index, tx);
            monoio::spawn(announce(rx, writer.clone()));
            (Some(m), Some(mine))
        }
        None => (None, None),
    };
    let ready = pb::NodeReadyRequest {
        node_id: node_id.clone(),
        config_revision: payload.revision,
        refused_workspaces,
        shares,
    };
    if writer.send(&envelope(2, Body::NodeReadyRequest(ready))).is_err() {
        return retry("connection closed before ready");
    }
    match next_frame(reader, shutdown, "NodeReadyResponse").await {
        Ok(env) => match env.body {
            Some(Body::NodeReadyResponse(r)) if r.ready => {}
            Some(Body::NodeReadyResponse(r)) => return retry(format!("edge refused ready: {}", r.reason)),
            _ => return retry("edge answered ready with an unexpected frame"),
        },
        Err(end) => return end,
    }
    tracing::info!(node = %node_id, link = link.index, links = link.count, providers = ?manager.adapter_ids(), workspaces = ?catalog.refs(), "node ready");

    let last_seen = Rc::new(Cell::new(Instant::now()));
    let closed = LocalCancel::new();
    monoio::spawn(heartbeat(cfg.testing, writer.clone(), last_seen.clone(), closed.clone(), reader.stopper()));
    monoio::spawn(drain_on_shutdown(
        shutdown.clone(),
        closed.clone(),
        manager.clone(),
        writer.clone(),
        reader.stopper(),
        cfg.shutdown_grace,
    ));

    let opened = crate::workspace::Opened::default();
    let reason = serve_frames(reader, writer, &manager, link, &opened, &last_seen, cfg.stream_coalesce).await;
    opened.clean_all(&link.workspaces);
    let reason = match reason.as_str() {
        STOPPED if writer.is_closed() => "write to the edge failed".to_owned(),
        STOPPED if !shutdown.is_cancelled() => "heartbeat_timeout".to_owned(),
        _ => reason,
    };
    closed.cancel();
    // Runs are bound to this connection: their events could go nowhere now.
    manager.detach();
    drop(membership);
    manager.cancel_all();
    if shutdown.is_cancelled() {
        return SessionEnd::Shutdown;
    }
    SessionEnd::Retry { established: true, reason }
}

/// Close reason when this side stopped its own reader.
const STOPPED: &str = "stopped locally";

/// Each provider's adapter, with a connection pool of its own read under
/// the node's `stream_coalesce`.
fn build_adapters(payload: &pb::NodeConfigPayload, coalesce: Duration) -> Result<Vec<Adapter>, String> {
    let client = ClientConfig { coalesce, ..ClientConfig::default() };
    payload
        .providers
        .iter()
        .map(|p| Adapter::from_config_with_client(p, &UpstreamClient::new(client)).map_err(|e| e.to_string()))
        .collect()
}

/// Each provider's long-context share of its slots, from the edge's config.
fn set_long_capacities(link: &LinkSpec, payload: &pb::NodeConfigPayload) {
    for p in &payload.providers {
        link.gates.set_long(&p.id, p.long_capacity);
    }
}

/// Writes the share table's announcements for this link's edge.
async fn announce(rx: iop_core::rt::mailbox::Receiver<pb::CapacityShares>, writer: FrameWriter) {
    while let Some(shares) = rx.recv().await {
        if writer.send(&envelope(0, Body::CapacityShares(shares))).is_err() {
            return;
        }
    }
}

async fn serve_frames<R: monoio::io::CancelableAsyncReadRent>(
    reader: &mut FrameReader<R>,
    writer: &FrameWriter,
    manager: &Rc<RunManager>,
    link: &LinkSpec,
    opened: &crate::workspace::Opened,
    last_seen: &Cell<Instant>,
    coalesce: Duration,
) -> String {
    loop {
        let env = match reader.next().await {
            Ok(Some(env)) => env,
            Ok(None) => return "edge closed the connection".into(),
            // Only the heartbeat and the shutdown drain stop the reader.
            Err(ReadError::Cancelled) => return STOPPED.into(),
            Err(e) => return format!("connection failed: {e}"),
        };
        last_seen.set(Instant::now());
        let cid = env.correlation_id;
        match env.body {
            Some(Body::RunRequest(req)) => manager.start(req),
            Some(Body::CancelRequest(c)) => manager.cancel(&c.run_id),
            Some(Body::StreamCredit(c)) => manager.credit(&c.id, c.bytes),
            Some(Body::Heartbeat(hb)) => {
                if hb.ping {
                    let pong = pb::Heartbeat { ping: false, sent_at_ms: hb.sent_at_ms };
                    let _ = writer.send(&envelope(cid, Body::Heartbeat(pong)));
                }
            }
            Some(Body::ShareDemand(d)) => {
                if let Some(table) = &link.shares {
                    table.report(link.edge_index, &d);
                }
            }
            Some(Body::ConfigRefresh(refresh)) => {
                let revision = refresh.config.as_ref().map(|c| c.revision).unwrap_or(0);
                let ack = match refresh.config.as_ref().map(|c| build_adapters(c, coalesce)) {
                    Some(Ok(adapters)) => {
                        if let Some(payload) = refresh.config.as_ref() {
                            set_long_capacities(link, payload);
                        }
                        manager.replace_adapters(adapters);
                        if let Some(table) = &link.shares {
                            table.reconfigured();
                        }
                        if let Some(payload) = refresh.config.as_ref() {
                            manager.config_applied(payload);
                        }
                        tracing::info!(revision, "provider config refreshed");
                        pb::ConfigRefreshAck { revision, applied: true, ..Default::default() }
                    }
                    Some(Err(e)) => {
                        tracing::error!(revision, error = %e, "refreshed provider config rejected; keeping the current one");
                        pb::ConfigRefreshAck { revision, applied: false, error: e, ..Default::default() }
                    }
                    None => pb::ConfigRefreshAck {
                        revision,
                        applied: false,
                        error: "refresh without config".into(),
                        ..Default::default()
                    },
                };
                match refresh.config {
                    // The catalog is checked again off this loop (it looks at
                    // the file system); the ack says what it refused.
                    Some(payload) if ack.applied => {
                        let (writer, workspaces) = (writer.clone(), link.workspaces.clone());
                        monoio::spawn(async move {
                            let (catalog, refused) = crate::workspace::admit(payload.workspaces, false).await;
                            workspaces.install(catalog.entries());
                            let ack = pb::ConfigRefreshAck { refused_workspaces: refused, ..ack };
                            let _ = writer.send(&envelope(cid, Body::ConfigRefreshAck(ack)));
                        });
                    }
                    _ => {
                        let _ = writer.send(&envelope(cid, Body::ConfigRefreshAck(ack)));
                    }
                }
            }
            Some(Body::NodeCommandRequest(cmd)) => crate::command::handle(cid, cmd, manager, writer),
            Some(Body::ProviderTunnelRequest(t)) => manager.start_tunnel(t),
            // The edge calls a request's workspace on one link only; what
            // this session opened is cleaned up when it ends (`Opened`).
            Some(
                body @ (Body::WorkspaceOpenRequest(_)
                | Body::WorkspaceToolRequest(_)
                | Body::WorkspaceArtifactRequest(_)
                | Body::WorkspaceCancelRequest(_)
                | Body::WorkspaceCleanupRequest(_)),
            ) => crate::workspace::serve(cid, body, &link.workspaces, writer, opened),
            Some(Body::NodeReadyResponse(_)) | Some(Body::RegisterResponse(_)) => {
                tracing::debug!("ignoring a late handshake response");
            }
            _ => return "protocol violation: unexpected frame from the edge".into(),
        }
        if writer.is_closed() {
            return "write to edge failed".into();
        }
    }
}

async fn heartbeat(
    timing: iop_core::config::TestingSettings,
    writer: FrameWriter,
    last_seen: Rc<Cell<Instant>>,
    closed: LocalCancel,
    stopper: ReadStopper,
) {
    if frames::heartbeat(timing, &writer, &last_seen, &closed).await == frames::Liveness::Silent {
        tracing::warn!("edge silent beyond the heartbeat wait; closing (heartbeat_timeout)");
        stopper.stop();
    }
}

/// On shutdown: refuse new runs, let in-flight runs finish within `grace`,
/// then cancel the rest and end the session.
async fn drain_on_shutdown(
    shutdown: LocalCancel,
    closed: LocalCancel,
    manager: Rc<RunManager>,
    writer: FrameWriter,
    stopper: ReadStopper,
    grace: std::time::Duration,
) {
    monoio::select! {
        _ = shutdown.cancelled() => {}
        _ = closed.cancelled() => return,
    }
    manager.start_draining();
    let draining = pb::NodeDraining { reason: "shutdown".into() };
    let _ = writer.send(&envelope(0, Body::NodeDraining(draining)));
    tracing::info!(active = manager.active(), "shutdown: draining in-flight runs");
    let drained = iop_core::rt::time::timeout(grace, manager.wait_idle()).await.is_ok();
    if !drained {
        tracing::warn!(active = manager.active(), "drain deadline passed; cancelling the remaining runs");
        manager.cancel_all();
        let _ = iop_core::rt::time::timeout(std::time::Duration::from_secs(1), manager.wait_idle()).await;
    }
    stopper.stop();
}
