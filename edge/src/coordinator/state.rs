//! A coordinated run's state graph and its terminal policy.
//!
//! ```text
//! accepted → planning → working ⇄ internal_tool → reviewing → repairing → working …
//!          ↘ (any stage) finalizing → completed | failed | cancelled
//! ```
//!
//! - An internal tool's result resumes only the stage that issued it.
//! - A terminal is proposed once (the first proposal wins) and moves the
//!   run to `finalizing`; once a workspace was opened, it is frozen only
//!   after that workspace's one cleanup, and a failed cleanup replaces a
//!   pending success (`end_turn` or `length`) with a `workspace_cleanup`
//!   error while an error or a cancel keeps its own class.
//! - It is frozen exactly once: the buffered and the streamed answer read
//!   the same disposition and emit at most one terminal.
//! - A client that went away is a silent `cancelled` (nothing is written).
//! - No retry, reselection or second request: nothing here goes back from
//!   `finalizing`.

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Admitted, before any model call.
    Accepted,
    /// The plan group writes the plan.
    Planning,
    /// The work group works with the workspace tools.
    Working,
    /// A tool call of `issued_by` runs on the node; its result resumes
    /// that stage only.
    InternalTool {
        /// The stage that issued the call.
        issued_by: Phase,
    },
    /// The review group judges the work.
    Reviewing,
    /// The review's findings go back to work.
    Repairing,
    /// A terminal is proposed; cleanup may still run.
    Finalizing,
    /// Ended with `end_turn` or `length`.
    Completed,
    /// Ended with an error.
    Failed,
    /// Ended by a cancel (the client left, or asked).
    Cancelled,
}

/// A stage that makes model calls (and may issue tool calls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// See [`Stage::Planning`].
    Planning,
    /// See [`Stage::Working`].
    Working,
    /// See [`Stage::Reviewing`].
    Reviewing,
}

impl Phase {
    fn stage(self) -> Stage {
        match self {
            Phase::Planning => Stage::Planning,
            Phase::Working => Stage::Working,
            Phase::Reviewing => Stage::Reviewing,
        }
    }
}

/// The closed classes of a failed run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// A stage's model call failed at the provider.
    Provider,
    /// The request itself is invalid.
    Validation,
    /// A stage or the request ran out of time.
    Timeout,
    /// Iterations, tool output or repair rounds ran out.
    Budget,
    /// The same action with the same result again: no progress.
    Repetition,
    /// A stage's output (plan, tool call, verdict) broke its schema.
    Malformed,
    /// The context grew past what the model takes.
    Context,
    /// A workspace tool failed on the node.
    InternalTool,
    /// The workspace's cleanup failed.
    WorkspaceCleanup,
}

impl ErrorClass {
    /// The label of metrics and the terminal event.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Provider => "provider",
            ErrorClass::Validation => "validation",
            ErrorClass::Timeout => "timeout",
            ErrorClass::Budget => "budget",
            ErrorClass::Repetition => "repetition",
            ErrorClass::Malformed => "malformed",
            ErrorClass::Context => "context",
            ErrorClass::InternalTool => "internal_tool",
            ErrorClass::WorkspaceCleanup => "workspace_cleanup",
        }
    }

    /// The Anthropic error `type` and HTTP status it answers with: the
    /// client's own mistakes are `invalid_request_error`, the rest
    /// `api_error`.
    pub fn anthropic(self) -> (&'static str, u16) {
        match self {
            ErrorClass::Validation | ErrorClass::Context => ("invalid_request_error", 400),
            _ => ("api_error", 500),
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Terminal {
    /// Done, approved: the answer is the final text.
    EndTurn,
    /// A stage hit its output limit: the answer says so and carries none
    /// of the private partial content.
    Length,
    /// Failed, by class.
    Error(ErrorClass),
    /// Cancelled; `silent` when the client left (nothing is written).
    Cancelled {
        /// The client is gone.
        silent: bool,
    },
}

impl Terminal {
    /// Whether the answer may carry the run's final text.
    pub fn exposes_content(self) -> bool {
        self == Terminal::EndTurn
    }

    /// Whether anything is written to the client.
    pub fn is_written(self) -> bool {
        !matches!(self, Terminal::Cancelled { silent: true })
    }

    fn stage(self) -> Stage {
        match self {
            Terminal::EndTurn | Terminal::Length => Stage::Completed,
            Terminal::Error(_) => Stage::Failed,
            Terminal::Cancelled { .. } => Stage::Cancelled,
        }
    }

    fn is_success(self) -> bool {
        matches!(self, Terminal::EndTurn | Terminal::Length)
    }
}

/// A move the graph does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// `from` cannot go to `to`.
    #[error("no transition from {from:?} to {to:?}")]
    Transition {
        /// Where the run was.
        from: Stage,
        /// Where it was asked to go.
        to: Stage,
    },
    /// A review asked for repair with no round left.
    #[error("no repair round left")]
    NoRepairLeft,
    /// The terminal cannot be frozen yet: the workspace's cleanup has not
    /// reported.
    #[error("cleanup pending")]
    CleanupPending,
    /// Nothing was proposed.
    #[error("no terminal proposed")]
    NothingProposed,
}

/// The workspace's cleanup, as far as the run knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cleanup {
    /// No workspace was opened: nothing to clean.
    NotNeeded,
    /// Opened, not cleaned yet.
    Pending,
    /// Cleaned (`true`) or the cleanup failed.
    Done(bool),
}

/// One coordinated run.
#[derive(Debug)]
pub struct Run {
    stage: Stage,
    repairs_left: u32,
    cleanup: Cleanup,
    proposed: Option<Terminal>,
    frozen: Option<Terminal>,
}

impl Run {
    /// A run allowed `repair_rounds` repairs.
    pub fn new(repair_rounds: u32) -> Self {
        Self {
            stage: Stage::Accepted,
            repairs_left: repair_rounds,
            cleanup: Cleanup::NotNeeded,
            proposed: None,
            frozen: None,
        }
    }

    /// Where it is.
    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// Moves to `to` along the graph.
    pub fn advance(&mut self, to: Stage) -> Result<(), StateError> {
        use Stage::*;
        let ok = match (self.stage, to) {
            (Accepted, Planning) | (Planning, Working) | (Working, Reviewing) | (Repairing, Working) => true,
            (Planning | Working | Reviewing, InternalTool { issued_by }) => issued_by.stage() == self.stage,
            (InternalTool { issued_by }, back) => issued_by.stage() == back,
            (Reviewing, Repairing) => {
                if self.repairs_left == 0 {
                    return Err(StateError::NoRepairLeft);
                }
                self.repairs_left -= 1;
                true
            }
            _ => false,
        };
        if !ok {
            return Err(StateError::Transition { from: self.stage, to });
        }
        self.stage = to;
        Ok(())
    }

    /// The workspace was opened: a cleanup must report before the end.
    pub fn workspace_opened(&mut self) {
        if self.cleanup == Cleanup::NotNeeded {
            self.cleanup = Cleanup::Pending;
        }
    }

    /// Whether the workspace still needs its cleanup.
    pub fn needs_cleanup(&self) -> bool {
        self.cleanup == Cleanup::Pending
    }

    /// Proposes how the run ends; the first proposal wins (a later one,
    /// a cancel racing a success among them, is ignored). Moves the run to
    /// `finalizing`.
    pub fn propose(&mut self, t: Terminal) {
        if self.proposed.is_none() && self.frozen.is_none() {
            self.proposed = Some(t);
            self.stage = Stage::Finalizing;
        }
    }

    /// The client went away: a silent cancel (unless something else was
    /// proposed first; it is then not written either, as no one reads).
    pub fn client_gone(&mut self) {
        self.propose(Terminal::Cancelled { silent: true });
    }

    /// The workspace's cleanup reported. A failure replaces a pending
    /// success; an error or a cancel keeps its class.
    pub fn cleaned(&mut self, ok: bool) {
        if self.cleanup != Cleanup::Pending {
            return;
        }
        self.cleanup = Cleanup::Done(ok);
        if !ok && self.proposed.is_none_or(Terminal::is_success) {
            self.proposed = Some(Terminal::Error(ErrorClass::WorkspaceCleanup));
            self.stage = Stage::Finalizing;
        }
    }

    /// Freezes the terminal (once: later calls give the same one) and ends
    /// the run.
    pub fn freeze(&mut self) -> Result<Terminal, StateError> {
        if let Some(t) = self.frozen {
            return Ok(t);
        }
        if self.cleanup == Cleanup::Pending {
            return Err(StateError::CleanupPending);
        }
        let t = self.proposed.ok_or(StateError::NothingProposed)?;
        self.frozen = Some(t);
        self.stage = t.stage();
        Ok(t)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[path = "state_tests.rs"]
mod tests;
