//! Thread-per-core runtime: one pinned monoio reactor per worker (io_uring
//! with epoll fallback), per-core `SO_REUSEPORT` listeners, cross-core
//! mailboxes, and a dedicated thread for blocking work.
//!
//! Runtime-specific code stays behind this module so a move to another
//! completion-based runtime touches little else.

pub mod alloc;
pub mod blocking;
pub mod clock;
pub mod either;
pub mod frames;
pub mod gather;
pub mod handoff;
pub mod io;
pub mod listener;
pub mod mailbox;
pub mod oneshot;
pub mod signal;
pub mod time;
pub mod timers;
mod worker;

pub use worker::{block_on_current, spawn_worker, yield_now, Driver};
