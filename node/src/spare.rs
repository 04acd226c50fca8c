//! Token texts and event vectors kept per core for the next token. A
//! streamed token is read into a string, sent, and freed; the events of
//! one read go in a vector given back while the provider thinks (a paced
//! stream holds none meanwhile). Kept here instead, a bounded few per core
//! (not per stream), the next token of any stream on this core takes them
//! again without an allocation.

use std::cell::RefCell;

use iop_core::{
    exec::{ExecEvent, Part},
    wire::pb::{self, run_event::Kind},
};

/// Texts kept at most, each of at most [`MAX_TEXT_BYTES`] bytes.
const MAX_TEXTS: usize = 64;
const MAX_TEXT_BYTES: usize = 256;
/// Event vectors kept at most, each of at most [`MAX_EVENT_SLOTS`] slots.
const MAX_VECS: usize = 16;
const MAX_EVENT_SLOTS: usize = 16;

thread_local! {
    static TEXTS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    static VECS: RefCell<Vec<Vec<ExecEvent>>> = const { RefCell::new(Vec::new()) };
}

/// `s` as a string of its own, in a kept one when this core has one.
pub fn text(s: &str) -> String {
    let kept = TEXTS.try_with(|t| t.try_borrow_mut().ok()?.pop()).ok().flatten();
    match kept {
        Some(mut t) => {
            t.push_str(s);
            t
        }
        None => s.to_owned(),
    }
}

/// Keeps `t`'s memory for the next [`text`] if it is small and there is
/// room; frees it otherwise.
pub fn keep(mut t: String) {
    if t.capacity() == 0 || t.capacity() > MAX_TEXT_BYTES {
        return;
    }
    t.clear();
    let mut t = Some(t);
    let _ = TEXTS.try_with(|kept| {
        if let Ok(mut kept) = kept.try_borrow_mut() {
            if kept.len() < MAX_TEXTS {
                kept.extend(t.take());
            }
        }
    });
}

/// Keeps the text of a sent event, if it holds one.
pub fn keep_event_text(ev: ExecEvent) {
    if let ExecEvent::Delta(d) = ev {
        if let Part::Content(t) | Part::Reasoning(t) | Part::Refusal(t) = d.part {
            keep(t);
        }
    }
}

/// Keeps the text of a sent wire event, if it holds one (taken out in
/// place: the 300-byte message is not moved for it).
pub fn keep_wire_text(ev: &mut pb::RunEvent) {
    if let Some(Kind::Delta(d) | Kind::ReasoningDelta(d) | Kind::RefusalDelta(d)) = &mut ev.kind {
        keep(std::mem::take(&mut d.text));
    }
}

/// An empty vector for one read's events (a kept one when this core has one).
pub fn events() -> Vec<ExecEvent> {
    VECS.try_with(|v| v.try_borrow_mut().ok()?.pop()).ok().flatten().unwrap_or_default()
}

/// Keeps the memory of `evs` (emptied) for the next [`events`] if it is
/// small and there is room; frees it otherwise.
pub fn keep_events(mut evs: Vec<ExecEvent>) {
    if evs.capacity() == 0 || evs.capacity() > MAX_EVENT_SLOTS {
        return;
    }
    evs.drain(..).for_each(keep_event_text);
    let mut evs = Some(evs);
    let _ = VECS.try_with(|kept| {
        if let Ok(mut kept) = kept.try_borrow_mut() {
            if kept.len() < MAX_VECS {
                kept.extend(evs.take());
            }
        }
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn a_sent_tokens_memory_holds_the_next() {
        let first = text("hello");
        let at = first.as_ptr();
        keep_event_text(ExecEvent::content(first));
        let next = text("world");
        assert_eq!((next.as_str(), next.as_ptr()), ("world", at), "the same memory, the new text");
        // A long text is freed, not kept; the kept are bounded.
        keep("x".repeat(4 * MAX_TEXT_BYTES));
        for _ in 0..2 * MAX_TEXTS {
            keep(String::with_capacity(8));
        }
        assert_eq!(TEXTS.with(|t| t.borrow().len()), MAX_TEXTS);
        assert!(TEXTS.with(|t| t.borrow().iter().all(|t| t.is_empty() && t.capacity() <= MAX_TEXT_BYTES)));
    }

    #[test]
    fn an_emptied_vector_comes_back_empty() {
        let mut evs = events();
        evs.push(ExecEvent::content("a"));
        let at = evs.as_ptr();
        keep_events(evs);
        let again = events();
        assert!(again.is_empty());
        assert_eq!(again.as_ptr(), at);
        // Its text went to the kept texts.
        assert_eq!(text("b").capacity(), 1);
    }
}
