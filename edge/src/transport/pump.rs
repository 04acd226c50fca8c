//! The command pump of a session: what any core asks of a node link (runs,
//! tunnels, credit, cancels, commands, workspace calls, config refreshes,
//! probes, close)
//! written to it in order; what is still queued when the link dies fails.

use std::{cell::RefCell, rc::Rc};

use iop_core::{
    exec::{codes, ExecEvent, FailureSource, RunFailure},
    rt::{frames::FrameWriter, mailbox, signal::LocalCancel},
    wire::pb::{self, envelope::Body},
};

use super::{envelope, runs::RunTable, session::Stop, SessionCmd};

/// Tells the node to stop run `run_id`.
pub(super) fn send_cancel(writer: &FrameWriter, run_id: String, reason: &str) {
    let req = pb::CancelRequest {
        kind: pb::CancelKind::CancelRun as i32,
        run_id,
        reason: reason.to_owned(),
        ..Default::default()
    };
    let _ = writer.send(&envelope(0, Body::CancelRequest(req)));
}

/// What the command pump of a session works with.
pub(super) struct Pumped {
    pub(super) runs: Rc<RefCell<RunTable>>,
    pub(super) commands: Rc<super::commands::PendingCommands>,
    pub(super) workspace: Rc<super::commands::PendingWorkspace>,
    pub(super) writer: FrameWriter,
    pub(super) closed: LocalCancel,
    pub(super) stop: Stop,
    pub(super) sent_revision: Rc<std::cell::Cell<u64>>,
    pub(super) leases: Option<Rc<crate::credentials::LinkCredentials>>,
    pub(super) probe_now: iop_core::rt::signal::LocalNotify,
}

/// A long-context request's capacity profile (a normal one's is left
/// empty outside managed mode: nothing to send).
const LONG: &str = "long";

/// Applies commands from any core to this session until it closes.
pub(super) async fn pump_commands(rx: mailbox::Receiver<SessionCmd>, p: Pumped) {
    let Pumped { runs, commands, workspace, writer, closed, stop, sent_revision, leases, probe_now } = p;
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
                } else if lease.class() == crate::pool::LeaseClass::Long {
                    // The node gates each class apart: it must know this one.
                    req.profile = LONG.into();
                }
                runs.borrow_mut().insert(req.run_id.clone(), events, Some(lease));
                if writer.send_run_request(&mut req).is_err() {
                    break;
                }
                // The target moves from the sent request to the entry (no copy).
                runs.borrow_mut().set_target(&req.run_id, std::mem::take(&mut req.target));
            }
            SessionCmd::Tunnel { mut req, events, lease } => {
                if let Some(l) = &leases {
                    l.seal_tunnel(&mut req, &lease);
                } else if lease.class() == crate::pool::LeaseClass::Long {
                    req.profile = LONG.into();
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
            SessionCmd::Workspace { call, reply } => {
                if let Some(id) = workspace.register(reply) {
                    if writer.send(&envelope(id, call.into_body())).is_err() {
                        workspace.forget(id);
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
            SessionCmd::Run { events, .. } => events.send_terminal(ExecEvent::Error(failure.clone()).into()),
            SessionCmd::Tunnel { events, .. } => {
                events.send_terminal(iop_core::tunnel::TunnelItem::Error(failure.clone()))
            }
            _ => {}
        }
    }
    rx
}
