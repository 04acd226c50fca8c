//! A normalized run's events as its client's task takes them: one by one as
//! events of their own ([`RunStream::next`]), or, for the stream's write
//! loop, as pieces whose tokens are read in place ([`RunStream::try_piece`]).

use iop_core::exec::{ExecEvent, TextKind};

use crate::{
    dispatch::Stream,
    run_item::{malformed_token, RunItem, TextRun},
};

/// The events of a normalized run. Dropping it before the terminal cancels
/// it on the node (see [`Stream`]).
pub struct RunStream {
    stream: Stream<RunItem>,
    /// An event taken by [`Self::ready`], not yet handed out.
    held: Option<ExecEvent>,
    /// The tokens being handed out, and the next one's index.
    texts: TextRun,
    at: usize,
}

/// What [`RunStream::try_piece`] hands out.
pub enum Piece<'a> {
    /// A token of choice 0: its kind and text.
    Text(TextKind, &'a str),
    /// Any other event.
    Event(ExecEvent),
    /// A token the node sent malformed: [`RunStream::malformed`] ends the
    /// stream and gives its terminal.
    Malformed,
}

impl RunStream {
    pub(crate) fn new(stream: Stream<RunItem>) -> Self {
        Self { stream, held: None, texts: TextRun::default(), at: 0 }
    }

    /// The event or next token held, as an event of its own.
    fn held_event(&mut self) -> Option<ExecEvent> {
        if let Some(ev) = self.held.take() {
            return Some(ev);
        }
        if self.at >= self.texts.len() {
            return None;
        }
        let ev = self.texts.event(self.at);
        self.at += 1;
        Some(ev.unwrap_or_else(|| self.malformed()))
    }

    /// Holds `item`'s tokens, or gives its event.
    fn hold(&mut self, item: RunItem) -> Option<ExecEvent> {
        match item {
            RunItem::Event(ev) => Some(ev),
            RunItem::Texts(t) => {
                (self.texts, self.at) = (t, 0);
                self.held_event()
            }
        }
    }

    /// Next event; after a terminal returns `None` (see [`Stream::next`]).
    pub async fn next(&mut self) -> Option<ExecEvent> {
        loop {
            if let Some(ev) = self.held_event() {
                return Some(ev);
            }
            let item = self.stream.next().await?;
            if let Some(ev) = self.hold(item) {
                return Some(ev);
            }
        }
    }

    /// The next event already queued, without waiting.
    pub fn try_next(&mut self) -> Option<ExecEvent> {
        loop {
            if let Some(ev) = self.held_event() {
                return Some(ev);
            }
            let item = self.stream.try_next()?;
            if let Some(ev) = self.hold(item) {
                return Some(ev);
            }
        }
    }

    /// Waits until something is queued and holds it for [`Self::try_piece`];
    /// false once the stream is over. Nothing is lost if the wait is cut
    /// short.
    pub async fn ready(&mut self) -> bool {
        if self.held.is_some() || self.at < self.texts.len() {
            return true;
        }
        match self.stream.next().await {
            None => false,
            Some(RunItem::Event(ev)) => {
                self.held = Some(ev);
                true
            }
            Some(RunItem::Texts(t)) => {
                (self.texts, self.at) = (t, 0);
                true
            }
        }
    }

    /// The next piece already queued, without waiting: a token is read
    /// where it arrived (no event is made of it).
    pub fn try_piece(&mut self) -> Option<Piece<'_>> {
        if let Some(ev) = self.held.take() {
            return Some(Piece::Event(ev));
        }
        while self.at >= self.texts.len() {
            match self.stream.try_next()? {
                RunItem::Event(ev) => return Some(Piece::Event(ev)),
                RunItem::Texts(t) => (self.texts, self.at) = (t, 0),
            }
        }
        self.at += 1;
        Some(match self.texts.token(self.at - 1) {
            Some((kind, text)) => Piece::Text(kind, text),
            None => Piece::Malformed,
        })
    }

    /// Ends the stream for a malformed token: the run is cancelled on the
    /// node; returns the error terminal to hand out.
    pub fn malformed(&mut self) -> ExecEvent {
        self.held = None;
        self.texts = TextRun::default();
        self.at = 0;
        match self.stream.fail_here(malformed_token()) {
            RunItem::Event(ev) => ev,
            RunItem::Texts(_) => ExecEvent::Error(malformed_token()),
        }
    }

    /// Events queued and not yet handed out (a hint: the node may add more).
    pub fn pending(&mut self) -> usize {
        usize::from(self.held.is_some()) + self.texts.len() - self.at.min(self.texts.len()) + self.stream.pending()
    }

    /// Gives back the memory of the stream's empty queue, before a long wait.
    pub fn shrink(&mut self) {
        if self.at >= self.texts.len() {
            // Its tokens are slices of a node link's read buffer.
            self.texts = TextRun::default();
            self.at = 0;
        }
        self.stream.shrink();
    }

    /// See [`Stream::credit_on_write`].
    pub fn credit_on_write(&mut self) {
        self.stream.credit_on_write();
    }

    /// See [`Stream::written`].
    pub fn written(&mut self) {
        self.stream.written();
    }

    /// Run id.
    pub fn run_id(&self) -> &str {
        self.stream.run_id()
    }

    /// Node the run was dispatched to.
    pub fn node_id(&self) -> &str {
        self.stream.node_id()
    }

    /// See [`Stream::report_to`].
    pub fn report_to(
        &mut self,
        finish: &std::rc::Rc<std::cell::RefCell<crate::server::Finish>>,
        key: &crate::pool::ResourceKey,
    ) {
        self.stream.report_to(finish, key);
    }
}
