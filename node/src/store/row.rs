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

/// `kind`'s low four bits for a tunnel; a normalized run's are its
/// operation (`RunOperation`'s wire number, which the proto keeps stable).
const KIND_TUNNEL: i64 = 15;
/// `kind`'s bit for a background run.
const KIND_BACKGROUND: i64 = 16;

/// A row's stored `kind`: its path, operation and background flag in one
/// small integer (one column where there were three: each costs an
/// insert about as much as a whole integer).
pub(crate) fn kind_code(path: Path, op: Option<crate::run::Operation>, background: bool) -> i64 {
    let what = match (path, op) {
        (Path::Tunnel, _) => KIND_TUNNEL,
        (Path::Normalized, None | Some(crate::run::Operation::Chat)) => 0,
        (Path::Normalized, Some(crate::run::Operation::Embeddings)) => 1,
        (Path::Normalized, Some(crate::run::Operation::Tokenize)) => 2,
    };
    what | if background { KIND_BACKGROUND } else { 0 }
}

/// A stored `kind` as the commands answer it: path, operation, background.
pub(crate) fn kind_names(kind: i64) -> (&'static str, Option<&'static str>, bool) {
    let background = kind & KIND_BACKGROUND != 0;
    match kind & KIND_TUNNEL {
        KIND_TUNNEL => ("tunnel", None, background),
        1 => ("normalized", Some("embeddings"), background),
        2 => ("normalized", Some("tokenize"), background),
        _ => ("normalized", Some("chat"), background),
    }
}

/// A run or tunnel as it ended. Times after `queued_at_ms` are offsets in
/// milliseconds on the monotonic clock.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    /// Its run id, session id, adapter and target.
    pub names: Names,
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

/// Largest session id kept, in bytes (a longer one is cut at a character
/// boundary): a correlation, not a payload.
pub const MAX_SESSION_ID: usize = 256;

/// `s` cut to at most `max` bytes at a character boundary.
pub(crate) fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut at = max;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    s.get(..at).unwrap_or_default()
}

/// A row's names, one after the other in one allocation: made when the
/// stream arrives (a running stream's only allocation for the store) and
/// moved into its row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    all: Box<str>,
    /// Where the run id, the session id and the adapter end in `all`.
    ends: [usize; 3],
}

impl Names {
    /// The names of a stream; a session id longer than [`MAX_SESSION_ID`]
    /// is cut at a character boundary (empty: none).
    pub fn new(run_id: &str, session_id: &str, adapter: &str, target: &str) -> Self {
        let session_id = clip(session_id, MAX_SESSION_ID);
        let e0 = run_id.len();
        let e1 = e0 + session_id.len();
        let ends = [e0, e1, e1 + adapter.len()];
        Self { all: [run_id, session_id, adapter, target].concat().into_boxed_str(), ends }
    }

    /// The edge's run or tunnel id.
    pub fn run_id(&self) -> &str {
        self.all.get(..self.ends[0]).unwrap_or_default()
    }

    /// The client's opaque session id; empty: none.
    pub fn session_id(&self) -> &str {
        self.all.get(self.ends[0]..self.ends[1]).unwrap_or_default()
    }

    /// The provider (adapter instance) id on this node.
    pub fn adapter(&self) -> &str {
        self.all.get(self.ends[1]..self.ends[2]).unwrap_or_default()
    }

    /// The upstream model name.
    pub fn target(&self) -> &str {
        self.all.get(self.ends[2]..).unwrap_or_default()
    }
}
