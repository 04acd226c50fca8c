//! Failures a surface concludes from a run's events, whatever the client's
//! dialect: each dialect renders them in its own error shape.

use iop_core::exec::{codes, FailureSource, RunFailure};

/// The node cancelled the run (it says why).
pub(crate) fn node_cancelled(reason: &str) -> RunFailure {
    RunFailure::new("cancelled", 503, FailureSource::Node, format!("run cancelled by the node: {reason}"))
}

/// The run's events ended before its result (no terminal event).
pub(crate) fn ended_without_result() -> RunFailure {
    RunFailure::new(codes::INTERNAL, 502, FailureSource::Edge, "run ended without a result")
}

/// The run's events broke the protocol (`message` says how).
pub(crate) fn protocol(message: &str) -> RunFailure {
    RunFailure::new(codes::UPSTREAM_PROTOCOL, 502, FailureSource::Node, message)
}
