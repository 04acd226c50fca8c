//! Execution primitives shared by edge and node: run events, usage and
//! failure classification, with conversions to and from the wire types.

use crate::wire::pb;

/// Token usage as reported by a provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Reasoning tokens, only when the provider reported them.
    pub reasoning_tokens: Option<u64>,
    /// Cached prompt tokens, only when the provider reported them.
    pub cached_input_tokens: Option<u64>,
}

impl From<Usage> for pb::Usage {
    fn from(u: Usage) -> Self {
        pb::Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            reasoning_tokens: u.reasoning_tokens,
            cached_input_tokens: u.cached_input_tokens,
        }
    }
}

impl From<pb::Usage> for Usage {
    fn from(u: pb::Usage) -> Self {
        Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            reasoning_tokens: u.reasoning_tokens,
            cached_input_tokens: u.cached_input_tokens,
        }
    }
}

/// Which side of the system a failure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureSource {
    /// The client's request was at fault.
    Client,
    /// The edge failed.
    Edge,
    /// The node failed.
    Node,
    /// The upstream provider failed.
    Provider,
}

/// A run failure with its classification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFailure {
    /// Low-cardinality class, usable as a metric label.
    pub code: &'static str,
    /// Human-readable message (never contains credentials).
    pub message: String,
    /// HTTP status to answer with (the provider's own status when it sent one).
    pub status: u16,
    /// Whether repeating the request elsewhere is safe.
    pub retryable: bool,
    /// Which side failed.
    pub source: FailureSource,
}

/// Closed set of failure codes; unknown wire codes map to `internal`.
pub mod codes {
    /// Provider answered with a non-2xx status.
    pub const UPSTREAM_STATUS: &str = "upstream_status";
    /// Provider could not be reached.
    pub const UPSTREAM_CONNECT: &str = "upstream_connect";
    /// Provider stream broke or was malformed.
    pub const UPSTREAM_PROTOCOL: &str = "upstream_protocol";
    /// Provider did not answer in time.
    pub const UPSTREAM_TIMEOUT: &str = "upstream_timeout";
    /// The provider's concurrency limit on the node is reached.
    pub const CAPACITY: &str = "capacity";
    /// The run names an adapter the node does not have.
    pub const UNKNOWN_ADAPTER: &str = "unknown_adapter";
    /// The node connection ended while the run was in flight.
    pub const NODE_DISCONNECTED: &str = "node_disconnected";
    /// The client consumed the stream too slowly.
    pub const SLOW_CONSUMER: &str = "slow_consumer";
    /// The run did not end within its deadline (the provider's
    /// `request_timeout_sec`), enforced by the edge.
    pub const DEADLINE_EXCEEDED: &str = "deadline_exceeded";
    /// The request was invalid for the provider.
    pub const INVALID_REQUEST: &str = "invalid_request";
    /// Anything else.
    pub const INTERNAL: &str = "internal";

    /// Every code, for mapping wire strings back to `&'static str`.
    pub const ALL: &[&str] = &[
        UPSTREAM_STATUS,
        UPSTREAM_CONNECT,
        UPSTREAM_PROTOCOL,
        UPSTREAM_TIMEOUT,
        CAPACITY,
        UNKNOWN_ADAPTER,
        NODE_DISCONNECTED,
        DEADLINE_EXCEEDED,
        SLOW_CONSUMER,
        INVALID_REQUEST,
        INTERNAL,
    ];
}

impl RunFailure {
    /// A failure with the given classification.
    pub fn new(code: &'static str, status: u16, source: FailureSource, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), status, retryable: false, source }
    }

    /// Marks the failure safe to retry.
    pub fn retryable(mut self) -> Self {
        self.retryable = true;
        self
    }
}

impl From<RunFailure> for pb::RunError {
    fn from(f: RunFailure) -> Self {
        let source = match f.source {
            FailureSource::Client => pb::ErrorSource::Client,
            FailureSource::Edge => pb::ErrorSource::Edge,
            FailureSource::Node => pb::ErrorSource::Node,
            FailureSource::Provider => pb::ErrorSource::Provider,
        };
        pb::RunError {
            code: f.code.to_owned(),
            message: f.message,
            status: u32::from(f.status),
            retryable: f.retryable,
            source: source as i32,
        }
    }
}

impl From<pb::RunError> for RunFailure {
    fn from(e: pb::RunError) -> Self {
        let code = codes::ALL.iter().copied().find(|c| *c == e.code).unwrap_or(codes::INTERNAL);
        let source = match pb::ErrorSource::try_from(e.source) {
            Ok(pb::ErrorSource::Client) => FailureSource::Client,
            Ok(pb::ErrorSource::Edge) => FailureSource::Edge,
            Ok(pb::ErrorSource::Provider) => FailureSource::Provider,
            _ => FailureSource::Node,
        };
        let status = u16::try_from(e.status).ok().filter(|s| (100..=599).contains(s)).unwrap_or(502);
        RunFailure { code, message: e.message, status, retryable: e.retryable, source }
    }
}

/// One event of a run, as produced by an adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    /// The provider accepted the request.
    Start {
        /// Model as reported by the provider.
        model: String,
    },
    /// Content text.
    Delta(String),
    /// Reasoning text (`reasoning_content`).
    ReasoningDelta(String),
    /// Successful end (terminal).
    Complete {
        /// OpenAI finish_reason.
        finish_reason: String,
        /// Final usage when the provider reported it.
        usage: Option<Usage>,
    },
    /// Failed end (terminal).
    Error(RunFailure),
    /// Cancelled end (terminal).
    Cancelled {
        /// Why.
        reason: String,
    },
}

impl ExecEvent {
    /// Whether this event ends the run.
    pub fn is_terminal(&self) -> bool {
        matches!(self, ExecEvent::Complete { .. } | ExecEvent::Error(_) | ExecEvent::Cancelled { .. })
    }

    /// Bytes of text this event carries: what a buffer of events holds.
    pub fn payload_bytes(&self) -> usize {
        match self {
            ExecEvent::Start { model } => model.len(),
            ExecEvent::Delta(t) | ExecEvent::ReasoningDelta(t) => t.len(),
            ExecEvent::Complete { finish_reason, .. } => finish_reason.len(),
            ExecEvent::Error(f) => f.message.len(),
            ExecEvent::Cancelled { reason } => reason.len(),
        }
    }

    /// Wire form of this event.
    pub fn into_wire(self, run_id: &str, seq: u64) -> pb::RunEvent {
        use pb::run_event::Kind;
        let mut usage = None;
        let kind = match self {
            ExecEvent::Start { model } => Kind::Start(pb::RunStart { model }),
            ExecEvent::Delta(text) => Kind::Delta(pb::TextDelta { text }),
            ExecEvent::ReasoningDelta(text) => Kind::ReasoningDelta(pb::TextDelta { text }),
            ExecEvent::Complete { finish_reason, usage: u } => {
                usage = u.map(pb::Usage::from);
                Kind::Complete(pb::RunComplete { finish_reason })
            }
            ExecEvent::Error(f) => Kind::Error(f.into()),
            ExecEvent::Cancelled { reason } => Kind::Cancelled(pb::RunCancelled { reason }),
        };
        pb::RunEvent { run_id: run_id.to_owned(), seq, kind: Some(kind), usage }
    }

    /// Validated event from the wire; `None` when the event has no kind.
    pub fn from_wire(ev: pb::RunEvent) -> Option<Self> {
        use pb::run_event::Kind;
        Some(match ev.kind? {
            Kind::Start(s) => ExecEvent::Start { model: s.model },
            Kind::Delta(d) => ExecEvent::Delta(d.text),
            Kind::ReasoningDelta(d) => ExecEvent::ReasoningDelta(d.text),
            Kind::Complete(c) => {
                ExecEvent::Complete { finish_reason: c.finish_reason, usage: ev.usage.map(Usage::from) }
            }
            Kind::Error(e) => ExecEvent::Error(e.into()),
            Kind::Cancelled(c) => ExecEvent::Cancelled { reason: c.reason },
        })
    }
}
