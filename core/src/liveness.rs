//! The response-stall contract shared by edge and node: the timeout a run
//! or tunnel carries, and the typed evidence a stall terminal brings back
//! (`ExecutionFailure` on the wire).

use std::time::Duration;

use crate::wire::pb;

/// What a wire value of 0 means.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_millis(300_000);
/// Largest stall timeout accepted, from the config or the wire (a day).
pub const MAX_STALL_TIMEOUT_MS: u64 = 86_400_000;

/// The stall timeout a request carries: 0 is the default; above
/// [`MAX_STALL_TIMEOUT_MS`] is refused (`Err` holds the value).
pub fn stall_timeout_from_wire(raw_ms: u64) -> Result<Duration, u64> {
    match raw_ms {
        0 => Ok(DEFAULT_STALL_TIMEOUT),
        ms if ms <= MAX_STALL_TIMEOUT_MS => Ok(Duration::from_millis(ms)),
        ms => Err(ms),
    }
}

/// What an exact-target health probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderHealth {
    /// The provider answers and lists the target: the request stalled.
    Available,
    /// The provider does not answer (or not for the target).
    Unavailable,
    /// The probe could not tell.
    Unknown,
    /// Answering "loading" (503), as llama.cpp's server and others do while
    /// they load a model: not failing, not ready yet. Node-local and in the
    /// capabilities probe's answer; a stall's evidence carries it as
    /// `unavailable` (the wire's pairs are three).
    Starting,
}

impl ProviderHealth {
    /// Label value (closed set).
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderHealth::Available => "available",
            ProviderHealth::Unavailable => "unavailable",
            ProviderHealth::Unknown => "unknown",
            ProviderHealth::Starting => "starting",
        }
    }

    /// The liveness classification this health implies (closed set).
    pub fn classification(self) -> &'static str {
        match self {
            ProviderHealth::Available => "request_stalled",
            ProviderHealth::Unavailable | ProviderHealth::Starting => "provider_unhealthy",
            ProviderHealth::Unknown => "health_unknown",
        }
    }

    fn to_wire(self) -> (pb::ProviderHealth, pb::LivenessClassification) {
        match self {
            ProviderHealth::Available => (pb::ProviderHealth::Available, pb::LivenessClassification::RequestStalled),
            ProviderHealth::Unavailable | ProviderHealth::Starting => {
                (pb::ProviderHealth::Unavailable, pb::LivenessClassification::ProviderUnhealthy)
            }
            ProviderHealth::Unknown => (pb::ProviderHealth::Unknown, pb::LivenessClassification::HealthUnknown),
        }
    }

    /// Reads a (health, classification) pair; anything but one of the
    /// three matching pairs is unknown (fail closed).
    fn from_wire(health: i32, classification: i32) -> Self {
        let pair = (pb::ProviderHealth::try_from(health), pb::LivenessClassification::try_from(classification));
        match pair {
            (Ok(pb::ProviderHealth::Available), Ok(pb::LivenessClassification::RequestStalled)) => {
                ProviderHealth::Available
            }
            (Ok(pb::ProviderHealth::Unavailable), Ok(pb::LivenessClassification::ProviderUnhealthy)) => {
                ProviderHealth::Unavailable
            }
            _ => ProviderHealth::Unknown,
        }
    }
}

/// What a `response_stalled` terminal carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StallEvidence {
    /// The timeout applied.
    pub timeout_ms: u64,
    /// How long nothing had come when the stall was claimed.
    pub idle_ms: u64,
    /// The joined probe's finding.
    pub health: ProviderHealth,
    /// The node connection's observation number (first is 1).
    pub seq: u64,
}

impl StallEvidence {
    /// Wire form.
    pub fn to_wire(self) -> pb::ExecutionFailure {
        let (health, classification) = self.health.to_wire();
        pb::ExecutionFailure {
            kind: pb::ExecutionFailureKind::ResponseStalled as i32,
            stall_timeout_ms: self.timeout_ms,
            idle_ms: self.idle_ms,
            provider_health: health as i32,
            liveness_classification: classification as i32,
            health_observation_seq: self.seq,
        }
    }

    /// From the wire; `None` unless it is a stall.
    pub fn from_wire(f: &pb::ExecutionFailure) -> Option<Self> {
        if pb::ExecutionFailureKind::try_from(f.kind) != Ok(pb::ExecutionFailureKind::ResponseStalled) {
            return None;
        }
        Some(Self {
            timeout_ms: f.stall_timeout_ms,
            idle_ms: f.idle_ms,
            health: ProviderHealth::from_wire(f.provider_health, f.liveness_classification),
            seq: f.health_observation_seq,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_the_default_and_too_large_is_refused() {
        assert_eq!(stall_timeout_from_wire(0), Ok(DEFAULT_STALL_TIMEOUT));
        assert_eq!(stall_timeout_from_wire(1500), Ok(Duration::from_millis(1500)));
        assert_eq!(stall_timeout_from_wire(MAX_STALL_TIMEOUT_MS + 1), Err(MAX_STALL_TIMEOUT_MS + 1));
    }

    #[test]
    fn evidence_roundtrips_and_mismatched_pairs_read_as_unknown() {
        for health in [ProviderHealth::Available, ProviderHealth::Unavailable, ProviderHealth::Unknown] {
            let e = StallEvidence { timeout_ms: 200, idle_ms: 201, health, seq: 3 };
            assert_eq!(StallEvidence::from_wire(&e.to_wire()), Some(e));
        }
        let starting = StallEvidence { timeout_ms: 1, idle_ms: 1, health: ProviderHealth::Starting, seq: 1 };
        assert_eq!(StallEvidence::from_wire(&starting.to_wire()).unwrap().health, ProviderHealth::Unavailable);
        let mut w = StallEvidence { timeout_ms: 1, idle_ms: 1, health: ProviderHealth::Available, seq: 1 }.to_wire();
        w.liveness_classification = pb::LivenessClassification::ProviderUnhealthy as i32;
        assert_eq!(StallEvidence::from_wire(&w).unwrap().health, ProviderHealth::Unknown);
        w.kind = 0;
        assert_eq!(StallEvidence::from_wire(&w), None);
    }
}
