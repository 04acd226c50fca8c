//! In-process deterministic mock provider. Its text matches the mock
//! upstream server `iop-mockprov`: content token `i` is `"tok{i} "`,
//! reasoning token `i` is `"think{i} "`.

use std::time::Duration;

use iop_core::{
    exec::{ExecEvent, Usage},
    wire::pb,
};

use crate::run::{EventSink, RunSpec, SinkClosed};

/// With no interval between tokens, yield to sibling tasks this often
/// (monoio has no preemption; a long stream would starve them).
const YIELD_EVERY: u32 = 64;

/// Mock behaviour.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MockSettings {
    /// Content tokens per completion (capped by the request's max_tokens).
    pub tokens: u32,
    /// Delay between tokens.
    pub token_interval: Duration,
    /// Delay before the first token.
    pub first_token_delay: Duration,
    /// Emit `tokens / 2` (at least 1) reasoning deltas before the content.
    pub reasoning: bool,
}

impl From<pb::MockSettings> for MockSettings {
    fn from(m: pb::MockSettings) -> Self {
        Self {
            tokens: m.tokens,
            token_interval: Duration::from_millis(u64::from(m.token_interval_ms)),
            first_token_delay: Duration::from_millis(u64::from(m.first_token_delay_ms)),
            reasoning: m.reasoning,
        }
    }
}

/// The in-process mock adapter.
#[derive(Debug, Clone)]
pub struct MockAdapter {
    id: String,
    max_concurrency: u32,
    settings: MockSettings,
}

impl MockAdapter {
    /// A mock provider.
    pub fn new(id: String, max_concurrency: u32, settings: MockSettings) -> Self {
        Self { id, max_concurrency, settings }
    }

    /// Provider id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Concurrent runs admitted.
    pub fn max_concurrency(&self) -> u32 {
        self.max_concurrency
    }

    /// Its behaviour.
    pub fn settings(&self) -> &MockSettings {
        &self.settings
    }

    /// Streams the deterministic completion for `spec`.
    pub async fn execute<S: EventSink>(&self, spec: RunSpec, sink: &mut S) {
        // SinkClosed means the run is gone: nothing left to do.
        let _ = self.run(&spec, sink).await;
    }

    async fn run<S: EventSink>(&self, spec: &RunSpec, sink: &mut S) -> Result<(), SinkClosed> {
        let s = &self.settings;
        sink.emit(ExecEvent::Start { model: spec.target.clone() }).await?;
        let reasoning = if s.reasoning { (s.tokens / 2).max(1) } else { 0 };
        let content = spec.max_tokens.map_or(s.tokens, |cap| s.tokens.min(cap));
        let mut step = 0u32;
        for i in 0..reasoning {
            self.pace(step).await;
            step = step.saturating_add(1);
            sink.emit(ExecEvent::ReasoningDelta(format!("think{i} "))).await?;
        }
        for i in 0..content {
            self.pace(step).await;
            step = step.saturating_add(1);
            sink.emit(ExecEvent::Delta(format!("tok{i} "))).await?;
        }
        let finish_reason = if content < s.tokens { "length" } else { "stop" };
        let usage = Usage {
            input_tokens: input_tokens(spec),
            output_tokens: u64::from(content),
            reasoning_tokens: s.reasoning.then_some(u64::from(reasoning)),
            cached_input_tokens: None,
        };
        sink.emit(ExecEvent::Complete { finish_reason: finish_reason.into(), usage: Some(usage) }).await
    }

    /// Waits before token number `step` (counting reasoning and content).
    async fn pace(&self, step: u32) {
        let s = &self.settings;
        if step == 0 {
            if !s.first_token_delay.is_zero() {
                monoio::time::sleep(s.first_token_delay).await;
            }
        } else if !s.token_interval.is_zero() {
            monoio::time::sleep(s.token_interval).await;
        } else if step.is_multiple_of(YIELD_EVERY) {
            iop_core::rt::yield_now().await;
        }
    }
}

/// Roughly four characters per token, at least one.
fn input_tokens(spec: &RunSpec) -> u64 {
    let chars: usize = spec.messages.iter().map(|m| m.content.chars().count()).sum();
    u64::try_from(chars / 4).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::{cell::Cell, rc::Rc, time::Instant};

    use super::*;
    use crate::adapter::tests::{spec, VecSink};

    fn mock(tokens: u32, reasoning: bool) -> MockAdapter {
        MockAdapter::new("m".into(), 1, MockSettings { tokens, reasoning, ..Default::default() })
    }

    fn run(adapter: &MockAdapter, spec: RunSpec) -> Vec<ExecEvent> {
        iop_core::rt::block_on_current(async {
            let mut sink = VecSink::default();
            adapter.execute(spec, &mut sink).await;
            sink.events
        })
        .unwrap()
    }

    fn complete(ev: &ExecEvent) -> (&str, Usage) {
        match ev {
            ExecEvent::Complete { finish_reason, usage: Some(u) } => (finish_reason, *u),
            other => panic!("not a complete with usage: {other:?}"),
        }
    }

    #[test]
    fn stop_when_under_max_tokens() {
        // 17 chars of content -> 4 input tokens.
        let evs = run(&mock(3, false), spec("model-a", "abcdefghijklmnopq", Some(10)));
        assert_eq!(evs[0], ExecEvent::Start { model: "model-a".into() });
        assert_eq!(
            &evs[1..4],
            &[ExecEvent::Delta("tok0 ".into()), ExecEvent::Delta("tok1 ".into()), ExecEvent::Delta("tok2 ".into())]
        );
        let (finish, usage) = complete(&evs[4]);
        assert_eq!(finish, "stop");
        assert_eq!(
            usage,
            Usage { input_tokens: 4, output_tokens: 3, reasoning_tokens: None, cached_input_tokens: None }
        );
        assert_eq!(evs.len(), 5);
    }

    #[test]
    fn length_when_capped_and_input_at_least_one() {
        let evs = run(&mock(5, false), spec("m", "hi", Some(2)));
        assert_eq!(evs.len(), 4);
        let (finish, usage) = complete(&evs[3]);
        assert_eq!((finish, usage.output_tokens, usage.input_tokens), ("length", 2, 1));
        // A cap equal to the token count is a normal stop.
        let evs = run(&mock(5, false), spec("m", "hi", Some(5)));
        assert_eq!(complete(evs.last().unwrap()).0, "stop");
    }

    #[test]
    fn reasoning_deltas_come_first() {
        let evs = run(&mock(4, true), spec("m", "", None));
        let kinds: Vec<_> = evs[1..evs.len() - 1].to_vec();
        assert_eq!(
            kinds,
            vec![
                ExecEvent::ReasoningDelta("think0 ".into()),
                ExecEvent::ReasoningDelta("think1 ".into()),
                ExecEvent::Delta("tok0 ".into()),
                ExecEvent::Delta("tok1 ".into()),
                ExecEvent::Delta("tok2 ".into()),
                ExecEvent::Delta("tok3 ".into()),
            ]
        );
        let (_, usage) = complete(evs.last().unwrap());
        assert_eq!((usage.output_tokens, usage.reasoning_tokens), (4, Some(2)));
        // One token still gets one reasoning delta.
        let evs = run(&mock(1, true), spec("m", "", None));
        assert_eq!(evs[1], ExecEvent::ReasoningDelta("think0 ".into()));
        assert_eq!(complete(evs.last().unwrap()).1.reasoning_tokens, Some(1));
    }

    #[test]
    fn zero_tokens_completes_at_once() {
        let evs = run(&mock(0, false), spec("m", "", None));
        assert_eq!(evs.len(), 2);
        assert_eq!(complete(&evs[1]).1.output_tokens, 0);
    }

    #[test]
    fn stops_when_sink_closes() {
        let adapter = mock(100, false);
        let evs = iop_core::rt::block_on_current(async {
            let mut sink = VecSink { close_after: Some(3), ..Default::default() };
            adapter.execute(spec("m", "", None), &mut sink).await;
            sink.events
        })
        .unwrap();
        assert_eq!(evs.len(), 3);
        assert!(!evs.iter().any(ExecEvent::is_terminal));
    }

    #[test]
    fn paces_tokens() {
        let adapter = MockAdapter::new(
            "m".into(),
            1,
            MockSettings {
                tokens: 3,
                token_interval: Duration::from_millis(20),
                first_token_delay: Duration::from_millis(50),
                reasoning: false,
            },
        );
        let started = Instant::now();
        let evs = run(&adapter, spec("m", "", None));
        assert_eq!(evs.len(), 5);
        assert!(started.elapsed() >= Duration::from_millis(90), "{:?}", started.elapsed());
    }

    #[test]
    fn long_unpaced_stream_lets_siblings_run() {
        let adapter = mock(1000, false);
        let ticks = Rc::new(Cell::new(0u32));
        let evs = iop_core::rt::block_on_current({
            let ticks = Rc::clone(&ticks);
            async move {
                let ticker = monoio::spawn({
                    let ticks = Rc::clone(&ticks);
                    async move {
                        loop {
                            ticks.set(ticks.get() + 1);
                            iop_core::rt::yield_now().await;
                        }
                    }
                });
                let mut sink = VecSink::default();
                adapter.execute(spec("m", "", None), &mut sink).await;
                drop(ticker);
                sink.events
            }
        })
        .unwrap();
        assert_eq!(evs.len(), 1002);
        assert!(ticks.get() >= 5, "sibling ran {} times", ticks.get());
    }
}
