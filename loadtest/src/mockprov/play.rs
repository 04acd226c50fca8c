//! Playing a [`Reply`] on a connection: the waits, the head, the frames as
//! HTTP chunks, and the recording of what was written (the response head and
//! the SHA-256 of every entity byte, fed as the bytes are written).

use std::io;
use std::time::{Duration, Instant};

use bytes::Bytes;
use iop_core::http::{write_chunk, write_last_chunk, write_response_head, Framing};

use super::clock::Timestamp;
use super::conn::{ActiveStream, Conn, Gone, Next};
use super::record::BodyHasher;
use super::reply::{self, Action, Flavor, Frame, Phase, Reply, Stream, Whole};
use super::Stats;

/// One wait of a stalled answer (it waits again until the client leaves).
const STALL_PAUSE: Duration = Duration::from_secs(3600);

/// The exchange being recorded: its id and the hash of the body so far.
#[derive(Debug)]
pub(super) struct Live {
    id: u64,
    hasher: BodyHasher,
}

impl Live {
    pub(super) fn new(id: u64) -> Self {
        Self { id, hasher: BodyHasher::default() }
    }
}

/// How one reply's head is written.
struct HeadSpec<'a> {
    flavor: Flavor,
    seq: u64,
    started: Instant,
    status: u16,
    content_type: &'a str,
    headers: &'a [(&'static str, String)],
    framing: Framing,
    ka: bool,
}

impl Conn {
    /// Plays `reply` (request number `seq`, which arrived at `started`).
    pub(super) async fn play(&mut self, reply: Reply, seq: u64, started: Instant, ka: bool) -> io::Result<Next> {
        let Reply { flavor, action, tag } = reply;
        match action {
            Action::Hangup => {
                // Read, counted, never answered: a provider that dies mid-request.
                self.finish_record(false);
                Ok(Next::Close)
            }
            Action::Whole(whole) => self.play_whole(flavor, whole, seq, started, ka, tag).await,
            Action::Stream(stream) => Ok(self.play_stream(flavor, stream, seq, started, ka, tag).await),
        }
    }

    /// The client left before the answer was complete.
    fn client_left(&mut self, seq: u64, tag: Option<String>) {
        let at = Timestamp::now();
        Stats::bump(&self.ctx.stats.early_closed);
        if let Some(tag) = tag {
            self.ctx.closes.borrow_mut().push(tag, seq, at);
        }
        self.finish_record(false);
    }

    async fn play_whole(
        &mut self,
        flavor: Flavor,
        w: Whole,
        seq: u64,
        started: Instant,
        ka: bool,
        tag: Option<String>,
    ) -> io::Result<Next> {
        if self.pause(w.delay).await.is_err() {
            self.client_left(seq, tag);
            return Ok(Next::Close);
        }
        if w.abort {
            Stats::bump(&self.ctx.stats.aborted);
            self.finish_record(false);
            return Ok(Next::Close);
        }
        self.write_head(&HeadSpec {
            flavor,
            seq,
            started,
            status: w.status,
            content_type: w.content_type,
            headers: &w.headers,
            framing: Framing::Length(w.body.len()),
            ka,
        });
        self.out.extend_from_slice(w.body.as_bytes());
        if let Some(live) = &mut self.live {
            live.hasher.update(w.body.as_bytes());
        }
        // Recorded before the write, so a client that reads the answer and
        // then asks `/last` always finds it complete.
        let id = self.finish_record(true);
        if let Err(e) = self.flush().await {
            self.mark_incomplete(id);
            return Err(e);
        }
        Ok(Next::KeepAlive)
    }

    async fn play_stream(
        &mut self,
        flavor: Flavor,
        stream: Stream,
        seq: u64,
        started: Instant,
        ka: bool,
        tag: Option<String>,
    ) -> Next {
        let stats = self.ctx.stats.clone();
        Stats::bump(&stats.streams_started);
        let _active = ActiveStream::new(&stats);
        match self.stream_inner(flavor, stream, seq, started, ka).await {
            Ok(next) => next,
            Err(Gone) => {
                self.client_left(seq, tag);
                Next::Close
            }
        }
    }

    async fn stream_inner(
        &mut self,
        flavor: Flavor,
        mut s: Stream,
        seq: u64,
        started: Instant,
        ka: bool,
    ) -> Result<Next, Gone> {
        let head = |conn: &mut Self| {
            conn.write_head(&HeadSpec {
                flavor,
                seq,
                started,
                status: 200,
                content_type: s.content_type,
                headers: &s.headers,
                framing: Framing::Chunked,
                ka,
            });
        };
        let mut head_written = s.eager_head;
        if head_written {
            head(self);
        }
        let mut frames: Vec<Frame> = Vec::new();
        let (mut past_lead, mut in_tail) = (false, false);
        let (mut paced, mut counted) = (0u64, 0u64);
        while let Some(phase) = s.script.next_phase() {
            if phase != Phase::Lead && !past_lead {
                past_lead = true;
                self.flush().await.map_err(|_| Gone)?;
                self.pause(s.timing.ttft).await?;
            }
            let aborts_here = match phase {
                Phase::Token { counted: true, .. } => true,
                Phase::Tail => !in_tail,
                _ => false,
            };
            if aborts_here && s.timing.abort_after == Some(counted) {
                Stats::bump(&self.ctx.stats.aborted);
                self.finish_record(false);
                return Ok(Next::Close);
            }
            if aborts_here && s.timing.stall_after == Some(counted) {
                // Silent with the connection open: what was sent is out, then
                // nothing until the client leaves (`pause` notices it).
                if !head_written {
                    head(self);
                }
                self.flush().await.map_err(|_| Gone)?;
                loop {
                    self.pause(STALL_PAUSE).await?;
                }
            }
            // A burst's steps go out together: paced at its first, written after its last.
            let burst = s.timing.burst.max(1);
            if let Phase::Token { paced: true, .. } = phase {
                if paced.is_multiple_of(burst) {
                    let interval = s.timing.interval.saturating_mul(u32::try_from(burst).unwrap_or(u32::MAX));
                    self.pace(paced / burst, interval).await?;
                }
                paced += 1;
            }
            frames.clear();
            s.script.render_next(Timestamp::now(), &mut frames);
            if !head_written {
                head_written = true;
                head(self);
            }
            self.push_frames(&frames);
            match phase {
                Phase::Lead => {}
                Phase::Token { counted: c, paced: p } => {
                    counted += u64::from(c);
                    if !p || paced.is_multiple_of(burst) {
                        self.flush().await.map_err(|_| Gone)?;
                    }
                }
                Phase::Tail => in_tail = true,
            }
        }
        if !head_written {
            head(self);
        }
        if s.timing.hold_open {
            // Everything sent but the body's end: a server that keeps the
            // stream open past its terminal event, until the client leaves.
            let id = self.finish_record(true);
            if self.flush().await.is_err() {
                self.mark_incomplete(id);
                return Err(Gone);
            }
            Stats::bump(&self.ctx.stats.streams_completed);
            loop {
                self.pause(STALL_PAUSE).await?;
            }
        }
        write_last_chunk(&mut self.out);
        let id = self.finish_record(true);
        if self.flush().await.is_err() {
            self.mark_incomplete(id);
            return Err(Gone);
        }
        Stats::bump(&self.ctx.stats.streams_completed);
        Ok(Next::KeepAlive)
    }

    /// Writes the response head with the flavor's headers and records it.
    fn write_head(&mut self, h: &HeadSpec<'_>) {
        let openai = match h.flavor {
            Flavor::OpenAi => Some((reply::openai_headers(h.seq), h.started.elapsed().as_millis().to_string())),
            Flavor::Anthropic | Flavor::Ollama => None,
        };
        let anthropic = (h.flavor == Flavor::Anthropic).then(|| reply::anthropic_request_id(h.seq));
        let mut headers: Vec<(&str, &str)> = Vec::with_capacity(h.headers.len() + 6);
        headers.push(("content-type", h.content_type));
        headers.extend(h.headers.iter().map(|(n, v)| (*n, v.as_str())));
        if let Some((name, id)) = &anthropic {
            headers.push((name, id.as_str()));
        }
        if let Some(([id, limit, remaining], ms)) = &openai {
            headers.push((id.0, id.1.as_str()));
            headers.push(("openai-processing-ms", ms.as_str()));
            headers.push((limit.0, limit.1.as_str()));
            headers.push((remaining.0, remaining.1.as_str()));
        }
        let start = self.out.len();
        write_response_head(&mut self.out, h.status, &headers, h.framing, h.ka);
        if let Some(live) = &self.live {
            if let Some(e) = self.ctx.log.borrow_mut().get_mut(live.id) {
                e.set_response_head(h.status, Bytes::copy_from_slice(&self.out[start..]));
            }
        }
    }

    /// Frames each frame and appends it as one HTTP chunk, hashing its bytes.
    fn push_frames(&mut self, frames: &[Frame]) {
        for frame in frames {
            self.event.clear();
            reply::frame_bytes(frame, &mut self.event);
            write_chunk(&mut self.out, &self.event);
            if let Some(live) = &mut self.live {
                live.hasher.update(&self.event);
            }
        }
    }

    /// Ends the recording of the current exchange, if any; returns its id.
    pub(super) fn finish_record(&mut self, complete: bool) -> Option<u64> {
        let live = self.live.take()?;
        let (sha, bytes) = live.hasher.finish();
        if let Some(e) = self.ctx.log.borrow_mut().get_mut(live.id) {
            e.finish(sha, bytes, complete);
        }
        Some(live.id)
    }

    /// The final write of exchange `id` failed after it was recorded complete.
    fn mark_incomplete(&mut self, id: Option<u64>) {
        if let Some(id) = id {
            if let Some(e) = self.ctx.log.borrow_mut().get_mut(id) {
                e.mark_incomplete();
            }
        }
    }
}
