//! Runtime provider health: an overlay on top of "online" (the connected,
//! configured state, which it never changes). Fresh `unavailable` stall
//! evidence lowers it; only a strictly newer `available` probe answer
//! raises it again. Scoped to one node connection generation: a new
//! generation starts healthy with no observation seen.

use iop_core::liveness::ProviderHealth;

use super::ResourceKey;
use crate::registry::Generation;

/// The overlay's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overlay {
    /// Nothing against the provider.
    #[default]
    Healthy,
    /// A stall's probe found it not answering, or not serving the target.
    Unavailable,
    /// A probe found it loading (503 "loading"): no traffic until ready.
    Starting,
}

impl Overlay {
    /// Label value (closed set), as the snapshot shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlay::Healthy => "healthy",
            Overlay::Unavailable => "unavailable",
            Overlay::Starting => "starting",
        }
    }

    pub(super) fn to_u8(self) -> u8 {
        match self {
            Overlay::Healthy => 0,
            Overlay::Unavailable => 1,
            Overlay::Starting => 2,
        }
    }

    pub(super) fn from_u8(v: u8) -> Self {
        match v {
            0 => Overlay::Healthy,
            2 => Overlay::Starting,
            _ => Overlay::Unavailable,
        }
    }
}

/// Where an observation came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A validated `response_stalled` terminal's joined probe.
    Stall,
    /// A capabilities recovery probe the edge asked for.
    Probe,
}

impl Source {
    /// Label value (closed set).
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Stall => "stall",
            Source::Probe => "probe",
        }
    }
}

/// One health observation about a leased resource, sent to its owner core.
#[derive(Debug, Clone)]
pub struct HealthReport {
    /// The resource (from the lease, never from the node's words).
    pub key: ResourceKey,
    /// The node connection generation it arrived on.
    pub generation: Generation,
    /// The link it arrived on: observation numbers are per link.
    pub link: u32,
    /// The link's observation number.
    pub seq: u64,
    /// What the probe found.
    pub health: ProviderHealth,
    /// The exact target probed (recovery probes ask about the same one).
    pub target: String,
    /// Stall or recovery probe.
    pub source: Source,
}

/// What applying an observation did (closed set, for logs and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// Healthy → unavailable.
    Lowered,
    /// Healthy → starting (a probe found it loading).
    Starting,
    /// Unavailable or starting → healthy.
    Recovered,
    /// Valid and fresh, but it changes nothing (available or unknown
    /// stall evidence, an unavailable probe answer, a repeat).
    Unchanged,
    /// Not about the resource's current generation, not newer than what
    /// was seen on its link, or about a resource no longer configured.
    Stale,
}

impl Observed {
    /// Label value (closed set).
    pub fn as_str(self) -> &'static str {
        match self {
            Observed::Lowered => "lowered",
            Observed::Starting => "starting",
            Observed::Recovered => "recovered",
            Observed::Unchanged => "unchanged",
            Observed::Stale => "stale",
        }
    }
}

/// A resource's overlay and what it has seen in its current generation.
#[derive(Debug, Default)]
pub(super) struct HealthState {
    pub overlay: Overlay,
    /// The target to probe while lowered.
    pub probe_target: Option<String>,
    /// Newest observation number seen per link (a handful of links).
    seen: Vec<(u32, u64)>,
}

impl HealthState {
    /// A new generation: healthy, nothing seen.
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// Applies a report already checked to be about the current generation.
    pub fn observe(&mut self, r: &HealthReport) -> Observed {
        match self.seen.iter_mut().find(|(link, _)| *link == r.link) {
            Some((_, last)) if r.seq <= *last => return Observed::Stale,
            Some((_, last)) => *last = r.seq,
            None => self.seen.push((r.link, r.seq)),
        }
        match (r.source, r.health, self.overlay) {
            (Source::Stall, ProviderHealth::Unavailable, Overlay::Healthy) => {
                self.overlay = Overlay::Unavailable;
                self.probe_target = Some(r.target.clone());
                Observed::Lowered
            }
            (Source::Probe, ProviderHealth::Starting, Overlay::Healthy) => {
                self.overlay = Overlay::Starting;
                self.probe_target = Some(r.target.clone());
                Observed::Starting
            }
            (Source::Probe, ProviderHealth::Available, Overlay::Unavailable | Overlay::Starting)
                if self.probe_target.as_deref() == Some(r.target.as_str()) =>
            {
                self.overlay = Overlay::Healthy;
                self.probe_target = None;
                Observed::Recovered
            }
            _ => Observed::Unchanged,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn report(link: u32, seq: u64, health: ProviderHealth, source: Source) -> HealthReport {
        HealthReport { key: ResourceKey::new("n", "p"), generation: 1, link, seq, health, target: "m".into(), source }
    }

    #[test]
    fn only_fresh_unavailable_stall_evidence_lowers_and_only_a_newer_available_probe_raises() {
        use ProviderHealth::{Available, Unavailable, Unknown};
        let mut h = HealthState::default();
        assert_eq!(h.observe(&report(0, 1, Available, Source::Stall)), Observed::Unchanged);
        assert_eq!(h.observe(&report(0, 2, Unknown, Source::Stall)), Observed::Unchanged);
        // A healthy provider is not "recovered" by a probe.
        assert_eq!(h.observe(&report(0, 3, Available, Source::Probe)), Observed::Unchanged);
        assert_eq!(h.overlay, Overlay::Healthy);
        assert_eq!(h.observe(&report(0, 4, Unavailable, Source::Stall)), Observed::Lowered);
        assert_eq!(h.probe_target.as_deref(), Some("m"));
        // Not newer on its link: stale, whatever it says.
        assert_eq!(h.observe(&report(0, 4, Available, Source::Probe)), Observed::Stale);
        assert_eq!(h.observe(&report(0, 2, Available, Source::Probe)), Observed::Stale);
        // Unavailable and unknown probe answers change nothing.
        assert_eq!(h.observe(&report(0, 5, Unavailable, Source::Probe)), Observed::Unchanged);
        assert_eq!(h.observe(&report(0, 6, Unknown, Source::Probe)), Observed::Unchanged);
        // Another link numbers its own observations.
        assert_eq!(h.observe(&report(1, 1, Unavailable, Source::Stall)), Observed::Unchanged);
        // An available answer about another target is not this recovery.
        let mut other = report(0, 7, Available, Source::Probe);
        other.target = "other".into();
        assert_eq!(h.observe(&other), Observed::Unchanged);
        assert_eq!(h.overlay, Overlay::Unavailable);
        assert_eq!(h.observe(&report(0, 8, Available, Source::Probe)), Observed::Recovered);
        assert_eq!((h.overlay, h.probe_target.as_deref()), (Overlay::Healthy, None));
        h.reset();
        assert_eq!(h.observe(&report(0, 1, Unavailable, Source::Stall)), Observed::Lowered);
    }

    #[test]
    fn a_loading_provider_is_starting_until_a_probe_finds_it_ready() {
        use ProviderHealth::{Available, Starting, Unavailable};
        let mut h = HealthState::default();
        assert_eq!(h.observe(&report(0, 1, Starting, Source::Probe)), Observed::Starting);
        assert_eq!(h.overlay, Overlay::Starting);
        assert_eq!(h.observe(&report(0, 2, Starting, Source::Probe)), Observed::Unchanged);
        assert_eq!(h.observe(&report(0, 3, Unavailable, Source::Probe)), Observed::Unchanged);
        assert_eq!(h.observe(&report(0, 4, Available, Source::Probe)), Observed::Recovered);
        assert_eq!(h.overlay, Overlay::Healthy);
    }

    #[test]
    fn labels_are_a_closed_set() {
        assert_eq!(Overlay::from_u8(Overlay::Unavailable.to_u8()), Overlay::Unavailable);
        assert_eq!(Overlay::from_u8(Overlay::Healthy.to_u8()), Overlay::Healthy);
        assert_eq!(Overlay::from_u8(Overlay::Starting.to_u8()), Overlay::Starting);
        let all = [Observed::Lowered, Observed::Starting, Observed::Recovered, Observed::Unchanged, Observed::Stale];
        assert_eq!(all.map(Observed::as_str), ["lowered", "starting", "recovered", "unchanged", "stale"]);
    }
}
