//! What one request did: its status, when its answer's first body byte
//! went out, how long it queued, where it ran and how it ended. Kept per
//! connection (reset for each request, its buffers reused) and turned into
//! the request's metrics and its one access-log line when it is answered.

use std::{
    cell::RefCell,
    rc::Rc,
    sync::Arc,
    time::{Duration, Instant},
};

use iop_core::exec::Usage;

use crate::{
    metrics,
    pool::{AffinityKey, Choice},
};

/// How the request's stream ended (written by the stream itself).
#[derive(Debug, Default)]
pub struct Finish {
    /// The configured model the request named ("" when none did).
    pub model: String,
    /// The run or tunnel id of its (last) attempt.
    pub id: String,
    /// Node and provider of its (last) attempt.
    pub node: Option<Arc<str>>,
    pub provider: Option<Arc<str>>,
    /// `complete`, `error`, `cancelled` (empty: no stream).
    pub outcome: &'static str,
    /// The error code when it failed.
    pub code: Option<&'static str>,
    /// Tokens the provider reported.
    pub usage: Option<Usage>,
    /// Attempts dispatched (2 after a replay before commit).
    pub attempts: u8,
}

/// The metrics' `surface` of a request no model route took.
const OTHER_SURFACE: &str = "other";

/// One request's record.
#[derive(Debug)]
pub struct Exchange {
    started: Instant,
    /// The request's method and path (clipped), for the log line.
    method: String,
    path: String,
    /// The response status (0 until a head is written).
    pub status: u16,
    /// When the first byte of the answer's body went out.
    pub first_byte: Option<Instant>,
    /// Time spent queued for capacity.
    pub queue_wait: Option<Duration>,
    /// The request's cache-affinity key and how it chose the target (of
    /// the last admission).
    pub affinity: (Option<AffinityKey>, Choice),
    /// Shared with the request's streams, which fill in how they ended.
    pub finish: Rc<RefCell<Finish>>,
    /// The client's API key, when keys are configured (charged the
    /// request's tokens when it ends).
    pub api_key: Option<Arc<crate::pool::keys::KeyState>>,
    /// What a translation left out of the request (names, comma-separated).
    dropped: String,
    /// The route's closed label for the metrics (`other` until a surface
    /// names it).
    surface: &'static str,
    /// The client's session id ([`super::session_id`]; "" when none): put
    /// on the request's runs and its log line.
    session_id: String,
}

impl Default for Exchange {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            method: String::new(),
            path: String::new(),
            status: 0,
            first_byte: None,
            queue_wait: None,
            affinity: (None, Choice::None),
            finish: Rc::default(),
            api_key: None,
            dropped: String::new(),
            surface: OTHER_SURFACE,
            session_id: String::new(),
        }
    }
}

impl Exchange {
    /// A new request begins (its head was just read); `session_header`:
    /// the header its session id is read from (None: off).
    pub fn begin(&mut self, head: &iop_core::http::RequestHead, session_header: Option<&str>) {
        self.begin_at(head, Instant::now(), session_header);
    }

    /// A record for `head` that began at `started` (a WebSocket's own line,
    /// after the lines of the responses it carried).
    pub fn begin_at(&mut self, head: &iop_core::http::RequestHead, started: Instant, session_header: Option<&str>) {
        self.reset(started);
        self.method.push_str(clip(&head.method, 16));
        self.path.push_str(clip(head.path(), 256));
        self.session_id.push_str(super::session_id::of(head, session_header));
    }

    /// The client's session id ("" when none), for the request's runs.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// A request that could not be read (no head): only its status is known.
    pub fn begin_unread(&mut self) {
        self.reset(Instant::now());
    }

    fn reset(&mut self, started: Instant) {
        self.started = started;
        self.method.clear();
        self.path.clear();
        self.status = 0;
        self.first_byte = None;
        self.queue_wait = None;
        self.affinity = (None, Choice::None);
        self.api_key = None;
        self.dropped.clear();
        self.surface = OTHER_SURFACE;
        self.session_id.clear();
        let mut f = self.finish.borrow_mut();
        f.model.clear();
        f.id.clear();
        f.node = None;
        f.provider = None;
        f.outcome = "";
        f.code = None;
        f.usage = None;
        f.attempts = 0;
    }

    /// The request is on the route labelled `surface` (a closed set).
    pub fn set_surface(&mut self, surface: &'static str) {
        self.surface = surface;
    }

    /// A translation left out what `names` names (client input: clipped).
    pub fn note_dropped(&mut self, names: &str) {
        self.dropped.clear();
        self.dropped.push_str(clip(names, 256));
    }

    /// A head with `status` is written.
    pub fn status(&mut self, status: u16) {
        self.status = status;
    }

    /// Body bytes went out (the first time counts).
    pub fn wrote(&mut self) {
        if self.first_byte.is_none() {
            self.first_byte = Some(Instant::now());
        }
    }

    /// The request is answered: its metrics and its access-log line.
    pub fn done(&self, access_log: bool) {
        let (method, path) = (self.method.as_str(), self.path.as_str());
        let now = Instant::now();
        let f = self.finish.borrow();
        let duration = now.saturating_duration_since(self.started);
        let ttft = self.first_byte.map(|t| t.saturating_duration_since(self.started));
        metrics::request(&metrics::RequestDone {
            model: &f.model,
            surface: self.surface,
            status: self.status,
            duration,
            ttft,
            queue_wait: self.queue_wait,
        });
        if let (Some(k), Some(u)) = (&self.api_key, f.usage) {
            k.charge_tokens(u.input_tokens.saturating_add(u.output_tokens));
        }
        if !access_log {
            return;
        }
        let ms = |d: Duration| (d.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0;
        let u = f.usage.unwrap_or_default();
        // Never the prompt, a header or a credential: ids, names and numbers.
        // The session id is the client's (visible ASCII, bounded): recorded
        // as a `&str`, which the formatter quotes and escapes. Of the
        // affinity key, only a short hash of its hash.
        let (key, choice) = self.affinity;
        let mut short = [0u8; 8];
        let affinity_key = key.map_or("", |k| hex8(k.short(), &mut short));
        tracing::info!(
            target: "iop::access",
            id = %f.id,
            session_id = self.session_id.as_str(),
            method,
            path,
            model = %f.model,
            surface = self.surface,
            node = f.node.as_deref().unwrap_or(""),
            provider = f.provider.as_deref().unwrap_or(""),
            status = self.status,
            outcome = f.outcome,
            code = f.code.unwrap_or(""),
            attempts = f.attempts,
            affinity = choice.label(),
            affinity_from = key.map_or("", |k| k.source.label()),
            affinity_key,
            api_key = self.api_key.as_ref().map_or("", |k| k.entry.name.as_str()),
            key_fp = self.api_key.as_ref().map(|k| k.entry.fingerprint()).unwrap_or_default(),
            ttft_ms = ttft.map(ms),
            duration_ms = ms(duration),
            queue_ms = self.queue_wait.map(ms),
            input_tokens = f.usage.map(|_| u.input_tokens),
            output_tokens = f.usage.map(|_| u.output_tokens),
            reasoning_tokens = u.reasoning_tokens,
            cached_tokens = u.cached_input_tokens,
            dropped = self.dropped.as_str(),
            "request"
        );
    }
}

/// `v` as 8 hex digits in `buf` (an affinity key as logged, without allocating).
fn hex8(v: u32, buf: &mut [u8; 8]) -> &str {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = b"0123456789abcdef"[((v >> (28 - 4 * i)) & 0xf) as usize];
    }
    std::str::from_utf8(buf).unwrap_or("")
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn clip(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn an_affinity_key_is_logged_as_eight_hex_digits() {
        let mut buf = [0u8; 8];
        assert_eq!(hex8(0x1a2b_3c4d, &mut buf), "1a2b3c4d");
        assert_eq!(hex8(0xf, &mut buf), "0000000f");
        let k = AffinityKey { hash: 0xdead_beef_0000_0001, source: crate::pool::affinity::KeySource::User };
        assert_eq!(hex8(k.short(), &mut buf), "deadbeef");
    }
}
