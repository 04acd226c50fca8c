//! The provider tunnel on the node: an edge-built HTTP request sent to an
//! OpenAI-compatible provider as is, its answer relayed back byte for byte
//! (`ProviderTunnelFrame`s), with the usage the provider reported read on
//! the way ([`watch`]).

mod json_top;
pub mod watch;

use std::time::Duration;

use bytes::Bytes;
use iop_core::{
    exec::{codes, FailureSource, RunFailure},
    http::HeaderName,
    tunnel::{self, TunnelItem},
    wire::pb,
};

/// One tunnel as an adapter receives it.
#[derive(Debug, Clone)]
pub struct TunnelSpec {
    /// Edge-assigned id (for logs).
    pub id: String,
    /// `POST` (the only method the tunnel routes use).
    pub method: String,
    /// Path under the provider's base URL, one of [`tunnel::PATHS`].
    pub path: &'static str,
    /// Client headers to forward (already filtered by the edge; filtered
    /// again here).
    pub headers: Vec<(HeaderName, Bytes)>,
    /// The body to send.
    pub body: Bytes,
    /// Leave the usage-only SSE event out of the relayed body.
    pub hide_usage_chunk: bool,
    /// Time left until the edge's deadline, if it set one.
    pub deadline: Option<Duration>,
    /// As [`crate::run::RunSpec::credential`].
    pub credential: Option<iop_core::config::Secret>,
}

impl TunnelSpec {
    /// Validates a request from the edge; the failure answers the tunnel.
    pub fn from_wire(req: pb::ProviderTunnelRequest, deadline: Option<Duration>) -> Result<Self, RunFailure> {
        let path = tunnel::PATHS.iter().copied().find(|p| *p == req.path).ok_or_else(|| {
            RunFailure::new(
                codes::INVALID_REQUEST,
                400,
                FailureSource::Edge,
                format!("the tunnel does not serve path {:?}", req.path.chars().take(64).collect::<String>()),
            )
        })?;
        if req.method != "POST" {
            return Err(RunFailure::new(
                codes::INVALID_REQUEST,
                405,
                FailureSource::Edge,
                "the tunnel only sends POST requests",
            ));
        }
        let mut headers = Vec::with_capacity(req.headers.len());
        for h in req.headers {
            let name = HeaderName::from_bytes(h.name).ok_or_else(|| {
                RunFailure::new(codes::INVALID_REQUEST, 400, FailureSource::Edge, "a tunnel header name is not a token")
            })?;
            if tunnel::forwards_request_header(name.as_bytes()) {
                headers.push((name, h.value));
            }
        }
        Ok(Self {
            id: req.tunnel_id,
            method: req.method,
            path,
            headers,
            body: req.body,
            hide_usage_chunk: req.hide_usage_chunk,
            deadline,
            credential: None,
        })
    }
}

/// Where a tunnel's items go, in order (see [`TunnelItem`]).
pub trait TunnelSink {
    /// Sends one item; `Err` when the edge no longer wants it.
    fn send(&mut self, item: TunnelItem) -> impl std::future::Future<Output = Result<(), crate::run::SinkClosed>>;
}

impl TunnelSink for crate::run::Emitter<TunnelItem> {
    async fn send(&mut self, item: TunnelItem) -> Result<(), crate::run::SinkClosed> {
        crate::run::Emitter::send(self, item).await
    }
}
