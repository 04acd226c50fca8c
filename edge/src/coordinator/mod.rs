//! The single-request coordinator (issue 26, being built): one Anthropic
//! request whose `model` is an agent, carried out as Plan → Work → Review
//! on configured model groups with tools run in a node's workspace, and
//! answered with one message.
//!
//! - [`state`]: the run's state graph and its one frozen terminal (the
//!   spec's S11 policy), pure logic: no I/O, no clock.

pub mod state;
