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
    /// The provider's own error fields (OpenAI's `code`, `param`, `type`),
    /// passed on to the client as sent.
    pub provider: Option<Box<ProviderError>>,
    /// How long the provider asked to wait before retrying.
    pub retry_after_ms: Option<u64>,
    /// The node's evidence when this is a `response_stalled` terminal.
    pub stall: Option<Box<crate::liveness::StallEvidence>>,
}

/// The fields of a provider's error object the client gets as sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProviderError {
    /// `error.code` (a string; numbers are kept as their text).
    pub code: Option<String>,
    /// `error.param`.
    pub param: Option<String>,
    /// `error.type`.
    pub kind: Option<String>,
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
    /// The provider sent nothing for its `response_stall_timeout_ms`.
    pub const RESPONSE_STALLED: &str = "response_stalled";
    /// The request was invalid for the provider.
    pub const INVALID_REQUEST: &str = "invalid_request";
    /// Anything else.
    pub const INTERNAL: &str = "internal";
    /// Managed mode: the run's credential lease was refused (one code per
    /// reason of `lease::LeaseError`).
    pub const LEASE_REVOKED: &str = "credential_lease_revoked";
    /// See [`LEASE_REVOKED`].
    pub const LEASE_DISABLED: &str = "credential_lease_disabled";
    /// See [`LEASE_REVOKED`].
    pub const LEASE_EXPIRED: &str = "credential_lease_expired";
    /// See [`LEASE_REVOKED`].
    pub const LEASE_STALE: &str = "credential_lease_stale";
    /// See [`LEASE_REVOKED`].
    pub const LEASE_REPLAYED: &str = "credential_lease_replayed";
    /// See [`LEASE_REVOKED`].
    pub const LEASE_WRONG_RECIPIENT: &str = "credential_lease_wrong_recipient";
    /// See [`LEASE_REVOKED`].
    pub const LEASE_MISMATCHED: &str = "credential_lease_mismatched";

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
        RESPONSE_STALLED,
        SLOW_CONSUMER,
        INVALID_REQUEST,
        INTERNAL,
        LEASE_REVOKED,
        LEASE_DISABLED,
        LEASE_EXPIRED,
        LEASE_STALE,
        LEASE_REPLAYED,
        LEASE_WRONG_RECIPIENT,
        LEASE_MISMATCHED,
    ];
}

impl RunFailure {
    /// A failure with the given classification.
    pub fn new(code: &'static str, status: u16, source: FailureSource, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            status,
            retryable: false,
            source,
            provider: None,
            retry_after_ms: None,
            stall: None,
        }
    }

    /// With the provider's own error fields and Retry-After.
    pub fn with_provider(mut self, provider: Option<ProviderError>, retry_after_ms: Option<u64>) -> Self {
        self.provider = provider.filter(|p| p.code.is_some() || p.param.is_some() || p.kind.is_some()).map(Box::new);
        self.retry_after_ms = retry_after_ms;
        self
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
        let provider = f.provider.map(|p| *p).unwrap_or_default();
        pb::RunError {
            code: f.code.to_owned(),
            message: f.message,
            status: u32::from(f.status),
            retryable: f.retryable,
            source: source as i32,
            provider_code: provider.code,
            provider_param: provider.param,
            provider_type: provider.kind,
            retry_after_ms: f.retry_after_ms,
            failure: f.stall.map(|s| s.to_wire()),
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
        let provider = ProviderError { code: e.provider_code, param: e.provider_param, kind: e.provider_type };
        RunFailure {
            code,
            message: e.message,
            status,
            retryable: e.retryable,
            source,
            provider: None,
            retry_after_ms: None,
            stall: e.failure.as_ref().and_then(crate::liveness::StallEvidence::from_wire).map(Box::new),
        }
        .with_provider(Some(provider), e.retry_after_ms)
    }
}

/// One piece of a choice's output.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// Content text.
    Content(String),
    /// Reasoning text (`reasoning_content`).
    Reasoning(String),
    /// Refusal text.
    Refusal(String),
    /// A fragment of a tool call (boxed: it is rare and four strings
    /// wide, and every event moves through a few queues by value).
    ToolCall(Box<ToolCallDelta>),
}

/// The plain texts a token's event carries in its shortest wire form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextKind {
    /// Content text.
    Content,
    /// Reasoning text.
    Reasoning,
}

impl TextKind {
    /// `text` as this kind's [`Part`].
    pub fn part(self, text: String) -> Part {
        match self {
            TextKind::Content => Part::Content(text),
            TextKind::Reasoning => Part::Reasoning(text),
        }
    }
}

/// A fragment of one tool call, as OpenAI streams them: the first fragment
/// of a call carries its id, type and name; later ones argument pieces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCallDelta {
    /// Position of the call among the choice's tool calls.
    pub index: u32,
    /// The call's id (first fragment; empty after).
    pub id: String,
    /// `function` (first fragment; empty after).
    pub kind: String,
    /// The function name (first fragment; empty after).
    pub name: String,
    /// The next piece of the JSON arguments.
    pub arguments: String,
}

/// Output for one choice.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    /// Which choice (0 unless n > 1).
    pub choice: u32,
    /// What it carries.
    pub part: Part,
    /// The provider's `logprobs` object for this piece (JSON), passed on.
    pub logprobs: Option<bytes::Bytes>,
}

/// One event of a run, as produced by an adapter.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecEvent {
    /// The provider accepted the request.
    Start {
        /// Model as reported by the provider.
        model: String,
    },
    /// A piece of output.
    Delta(Delta),
    /// One choice ended (before the terminal, or one of several).
    ChoiceFinish {
        /// Which choice.
        choice: u32,
        /// OpenAI finish_reason.
        finish_reason: String,
        /// The stop sequence that ended it, when the provider named it.
        stop_sequence: Option<String>,
    },
    /// The vectors of an embeddings run, one per input, in order.
    Embeddings(Vec<Vec<f32>>),
    /// Successful end (terminal).
    Complete {
        /// OpenAI finish_reason of choice 0 when no `ChoiceFinish` said it.
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
    /// Content text of choice 0.
    pub fn content(text: impl Into<String>) -> Self {
        ExecEvent::Delta(Delta { choice: 0, part: Part::Content(text.into()), logprobs: None })
    }

    /// Reasoning text of choice 0.
    pub fn reasoning(text: impl Into<String>) -> Self {
        ExecEvent::Delta(Delta { choice: 0, part: Part::Reasoning(text.into()), logprobs: None })
    }

    /// Whether this event ends the run.
    pub fn is_terminal(&self) -> bool {
        matches!(self, ExecEvent::Complete { .. } | ExecEvent::Error(_) | ExecEvent::Cancelled { .. })
    }

    /// Bytes this event carries: what a buffer of events holds.
    pub fn payload_bytes(&self) -> usize {
        match self {
            ExecEvent::Start { model } => model.len(),
            ExecEvent::Delta(d) => {
                let part = match &d.part {
                    Part::Content(t) | Part::Reasoning(t) | Part::Refusal(t) => t.len(),
                    Part::ToolCall(c) => c.id.len() + c.kind.len() + c.name.len() + c.arguments.len(),
                };
                part + d.logprobs.as_ref().map_or(0, bytes::Bytes::len)
            }
            ExecEvent::ChoiceFinish { finish_reason, stop_sequence, .. } => {
                finish_reason.len() + stop_sequence.as_ref().map_or(0, String::len)
            }
            ExecEvent::Embeddings(v) => v.iter().map(|e| e.len() * 4).sum(),
            ExecEvent::Complete { finish_reason, .. } => finish_reason.len(),
            ExecEvent::Error(f) => f.message.len(),
            ExecEvent::Cancelled { reason } => reason.len(),
        }
    }

    /// Wire form of this event.
    pub fn into_wire(self, run_id: &str, seq: u64) -> pb::RunEvent {
        pb::RunEvent { run_id: bytes::Bytes::copy_from_slice(run_id.as_bytes()), ..self.into_wire_unnamed(seq) }
    }

    /// Wire form of this event without its run's id, which
    /// [`crate::wire::encode_run_event`] writes beside it from a borrowed
    /// `&str` (no copy of the id per event).
    pub fn into_wire_unnamed(self, seq: u64) -> pb::RunEvent {
        use pb::run_event::Kind;
        let mut ev = pb::RunEvent { seq, ..Default::default() };
        let kind = match self {
            ExecEvent::Start { model } => Kind::Start(pb::RunStart { model }),
            ExecEvent::Delta(d) => {
                ev.choice = d.choice;
                ev.logprobs_json = d.logprobs.unwrap_or_default();
                match d.part {
                    Part::Content(text) => Kind::Delta(pb::TextDelta { text }),
                    Part::Reasoning(text) => Kind::ReasoningDelta(pb::TextDelta { text }),
                    Part::Refusal(text) => Kind::RefusalDelta(pb::TextDelta { text }),
                    Part::ToolCall(c) => Kind::ToolCall(pb::ToolCallDelta {
                        index: c.index,
                        id: c.id,
                        r#type: c.kind,
                        name: c.name,
                        arguments: c.arguments,
                    }),
                }
            }
            ExecEvent::ChoiceFinish { choice, finish_reason, stop_sequence } => {
                ev.choice = choice;
                Kind::ChoiceFinish(pb::ChoiceFinish { finish_reason, stop_sequence: stop_sequence.unwrap_or_default() })
            }
            ExecEvent::Embeddings(vectors) => Kind::Embeddings(pb::Embeddings {
                data: vectors.into_iter().map(|values| pb::Embedding { values }).collect(),
            }),
            ExecEvent::Complete { finish_reason, usage } => {
                ev.usage = usage.map(pb::Usage::from);
                Kind::Complete(pb::RunComplete { finish_reason })
            }
            ExecEvent::Error(f) => Kind::Error(f.into()),
            ExecEvent::Cancelled { reason } => Kind::Cancelled(pb::RunCancelled { reason }),
        };
        ev.kind = Some(kind);
        ev
    }

    /// Validated event from the wire; `None` when the event has no kind.
    pub fn from_wire(ev: pb::RunEvent) -> Option<Self> {
        use pb::run_event::Kind;
        let choice = ev.choice;
        let logprobs = (!ev.logprobs_json.is_empty()).then_some(ev.logprobs_json);
        let delta = |part| Some(ExecEvent::Delta(Delta { choice, part, logprobs: logprobs.clone() }));
        match ev.kind? {
            Kind::Start(s) => Some(ExecEvent::Start { model: s.model }),
            Kind::Delta(d) => delta(Part::Content(d.text)),
            Kind::ReasoningDelta(d) => delta(Part::Reasoning(d.text)),
            Kind::RefusalDelta(d) => delta(Part::Refusal(d.text)),
            Kind::ToolCall(c) => delta(Part::ToolCall(Box::new(ToolCallDelta {
                index: c.index,
                id: c.id,
                kind: c.r#type,
                name: c.name,
                arguments: c.arguments,
            }))),
            Kind::ChoiceFinish(f) => Some(ExecEvent::ChoiceFinish {
                choice,
                finish_reason: f.finish_reason,
                stop_sequence: (!f.stop_sequence.is_empty()).then_some(f.stop_sequence),
            }),
            Kind::Embeddings(e) => Some(ExecEvent::Embeddings(e.data.into_iter().map(|v| v.values).collect())),
            Kind::Complete(c) => {
                Some(ExecEvent::Complete { finish_reason: c.finish_reason, usage: ev.usage.map(Usage::from) })
            }
            Kind::Error(e) => Some(ExecEvent::Error(e.into())),
            Kind::Cancelled(c) => Some(ExecEvent::Cancelled { reason: c.reason }),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn every_event_roundtrips_through_the_wire() {
        let failure = RunFailure::new(codes::UPSTREAM_STATUS, 429, FailureSource::Provider, "slow down")
            .retryable()
            .with_provider(
                Some(ProviderError {
                    code: Some("rate_limit_exceeded".into()),
                    param: None,
                    kind: Some("requests".into()),
                }),
                Some(7000),
            );
        let events = vec![
            ExecEvent::Start { model: "m".into() },
            ExecEvent::content("hi"),
            ExecEvent::reasoning("hmm"),
            ExecEvent::Delta(Delta {
                choice: 1,
                part: Part::Refusal("no".into()),
                logprobs: Some(bytes::Bytes::from_static(br#"{"refusal":[]}"#)),
            }),
            ExecEvent::Delta(Delta {
                choice: 2,
                part: Part::ToolCall(Box::new(ToolCallDelta {
                    index: 1,
                    id: "call_1".into(),
                    kind: "function".into(),
                    name: "f".into(),
                    arguments: "{\"a\"".into(),
                })),
                logprobs: None,
            }),
            ExecEvent::ChoiceFinish { choice: 1, finish_reason: "tool_calls".into(), stop_sequence: None },
            ExecEvent::Embeddings(vec![vec![0.5, -1.25], vec![]]),
            ExecEvent::Complete {
                finish_reason: "stop".into(),
                usage: Some(Usage { input_tokens: 1, ..Default::default() }),
            },
            ExecEvent::Complete { finish_reason: "length".into(), usage: None },
            ExecEvent::Error(failure),
            ExecEvent::Cancelled { reason: "x".into() },
        ];
        for ev in events {
            let wire = ev.clone().into_wire("r", 3);
            assert_eq!(ExecEvent::from_wire(wire), Some(ev));
        }
    }
}
