//! When a streamed body's next read may start. Without I/O: the client's
//! read loop asks before each read and reports after it.
//!
//! A model that streams faster than the window (its reads keep finding a
//! little data at once) is read at most once per window, so one read, one
//! frame to the edge and one client write carry every token that arrived
//! meanwhile, instead of one token or two each: at a few hundred tokens a
//! second per stream that is most of the relay's cost (each receive of a
//! small segment is a system call, an acknowledgement to the provider and a
//! wake-up down the chain). A token is then late by at most the window. A
//! stream paced slower than the window (tokens tens of milliseconds apart),
//! the first reads of a body and a read that fills its room (a backlog, so
//! more is waiting) never wait.

use std::time::Duration;

use monoio::time::Instant;

/// The pacing state of one body.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Pacer {
    /// The last read found a little data at once.
    quick: bool,
    /// While the body is fast: when the next read may start.
    until: Option<Instant>,
}

impl Pacer {
    /// When the next read may start, if it must wait (`now` is before it).
    pub(crate) fn wait_until(&self, now: Instant) -> Option<Instant> {
        self.until.filter(|&until| until > now)
    }

    /// A read that started at `started` ended at `now` with `n` bytes of the
    /// `room` it offered (0: end of body or an error). Two quick reads in a
    /// row (each brought less than its room, within `window` of its start)
    /// make the next one wait until `window` after the last one started.
    pub(crate) fn read(&mut self, window: Duration, started: Instant, now: Instant, n: usize, room: usize) {
        let quick = n > 0 && n < room && now < started + window;
        self.until = (quick && self.quick).then_some(started + window);
        self.quick = quick;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_millis(2);
    const ROOM: usize = 1024;

    fn ms(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    /// Reads that each start when the last one ended, taking `waits[i]` ms
    /// and bringing `sizes[i]` bytes; returns what each next read waits for.
    fn run(waits: &[u64], sizes: &[usize]) -> Vec<Option<Duration>> {
        let t0 = Instant::now();
        let (mut p, mut at, mut out) = (Pacer::default(), t0, Vec::new());
        for (&w, &n) in waits.iter().zip(sizes) {
            if let Some(until) = p.wait_until(at) {
                at = until;
            }
            let started = at;
            at = ms(started, w);
            p.read(W, started, at, n, ROOM);
            out.push(p.wait_until(at).map(|u| u - at));
        }
        out
    }

    #[test]
    fn a_fast_stream_is_read_once_per_window_from_its_second_quick_read() {
        let waits = run(&[0, 0, 0, 0], &[300, 300, 300, 300]);
        assert_eq!(waits, vec![None, Some(W), Some(W), Some(W)]);
    }

    #[test]
    fn a_stream_paced_slower_than_the_window_never_waits() {
        assert_eq!(run(&[20, 20, 20, 20], &[300; 4]), vec![None; 4]);
        // A token in two segments: one quick read at a time is not enough.
        assert_eq!(run(&[20, 0, 20, 0, 20, 0], &[150; 6]), vec![None; 6]);
    }

    #[test]
    fn a_read_that_fills_its_room_or_ends_the_body_never_waits() {
        assert_eq!(run(&[0, 0, 0], &[ROOM, ROOM, ROOM]), vec![None; 3]);
        assert_eq!(run(&[0, 0, 0], &[300, 300, 0]), vec![None, Some(W), None]);
    }

    #[test]
    fn a_pause_ends_the_pacing_and_the_window_counts_from_the_read_start() {
        // Fast, then a 20 ms pause: the read after it is not held.
        assert_eq!(run(&[0, 0, 20, 0], &[300; 4]), vec![None, Some(W), None, None]);
        // A quick read that took 1 ms of the window leaves the rest to wait.
        assert_eq!(run(&[1, 1], &[300, 300]), vec![None, Some(Duration::from_millis(1))]);
    }

    #[test]
    fn a_zero_window_never_waits() {
        let t0 = Instant::now();
        let mut p = Pacer::default();
        for _ in 0..3 {
            p.read(Duration::ZERO, t0, t0, 300, ROOM);
            assert_eq!(p.wait_until(t0), None);
        }
    }
}
