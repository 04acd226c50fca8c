//! One row of the run store: a run or tunnel as it ended. Ids, small
//! integers and closed labels only: no prompt, no body, no credential.

use iop_core::exec::Usage;

/// Which wire a stream came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// A `RunRequest`: the node's adapter speaks to the provider.
    Normalized,
    /// A `ProviderTunnelRequest`: the provider's bytes relayed as they are.
    Tunnel,
}

impl Path {
    /// Its stored value.
    pub(crate) fn code(self) -> i64 {
        match self {
            Path::Normalized => 0,
            Path::Tunnel => 1,
        }
    }

    /// Its name in query answers.
    pub(crate) fn name(code: i64) -> &'static str {
        if code == 1 {
            "tunnel"
        } else {
            "normalized"
        }
    }
}

/// How a stream ended (the edge's run outcomes, by the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Its `complete` (a run) or `end` (a tunnel) was sent.
    Complete,
    /// It ended with an error terminal.
    Error,
    /// The edge cancelled it, or its link closed, before any terminal.
    Cancelled,
}

impl Status {
    /// Every status, in stored order.
    pub const ALL: [Status; 3] = [Status::Complete, Status::Error, Status::Cancelled];

    /// Its stored value.
    pub(crate) fn code(self) -> i64 {
        match self {
            Status::Complete => 0,
            Status::Error => 1,
            Status::Cancelled => 2,
        }
    }

    /// Its name in query answers and filters.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Complete => "complete",
            Status::Error => "error",
            Status::Cancelled => "cancelled",
        }
    }

    /// The status named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    pub(crate) fn name(code: i64) -> &'static str {
        Self::ALL.into_iter().find(|s| s.code() == code).map_or("unknown", Status::as_str)
    }
}

/// What a normalized run asked for; stored as `RunOperation`'s wire
/// number, which the proto keeps stable.
pub(crate) fn operation_code(op: crate::run::Operation) -> i64 {
    match op {
        crate::run::Operation::Chat => 0,
        crate::run::Operation::Embeddings => 1,
        crate::run::Operation::Tokenize => 2,
    }
}

/// The name of a stored operation.
pub(crate) fn operation_name(code: i64) -> &'static str {
    match code {
        1 => "embeddings",
        2 => "tokenize",
        _ => "chat",
    }
}

/// A run or tunnel as it ended. Times after `queued_at_ms` are offsets in
/// milliseconds on the monotonic clock.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    /// The edge's run or tunnel id.
    pub run_id: String,
    /// The client's opaque session id; empty: none.
    pub session_id: String,
    /// The provider (adapter instance) id on this node.
    pub adapter: String,
    /// The upstream model name.
    pub target: String,
    /// Normalized run or tunnel.
    pub path: Path,
    /// A normalized run's operation (none for a tunnel).
    pub operation: Option<crate::run::Operation>,
    /// A background run. No request is one yet (the edge refuses the
    /// Responses API's `background`): always false for now.
    pub background: bool,
    /// How it ended.
    pub status: Status,
    /// The HTTP status its answer carried: 200 for a complete run, the
    /// provider's status for a tunnel, the failure's status for an error;
    /// none when cancelled before any.
    pub code: Option<u16>,
    /// When the request arrived on the node (Unix ms).
    pub queued_at_ms: u64,
    /// When it was admitted and handed to its adapter (none: refused).
    pub started_ms: Option<u64>,
    /// When its first output (a delta, a body byte) went to the edge.
    pub first_byte_ms: Option<u64>,
    /// When it ended.
    pub ended_ms: u64,
    /// The usage the provider reported, if any.
    pub usage: Option<Usage>,
    /// The failure's class (`iop_core::exec::codes`), when it failed.
    pub error_class: Option<&'static str>,
}

impl RunRow {
    /// A placeholder (what a sent row leaves behind).
    pub(crate) const EMPTY: RunRow = RunRow {
        run_id: String::new(),
        session_id: String::new(),
        adapter: String::new(),
        target: String::new(),
        path: Path::Normalized,
        operation: None,
        background: false,
        status: Status::Cancelled,
        code: None,
        queued_at_ms: 0,
        started_ms: None,
        first_byte_ms: None,
        ended_ms: 0,
        usage: None,
        error_class: None,
    };
}

/// Largest session id kept, in bytes (a longer one is cut at a character
/// boundary): a correlation, not a payload.
pub const MAX_SESSION_ID: usize = 256;

/// `s` cut to at most `max` bytes at a character boundary.
pub(crate) fn clip(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut at = max;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}
