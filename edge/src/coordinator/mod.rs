//! The single-request coordinator: one Anthropic request whose `model` is
//! an agent, carried out as Plan → Work → Review on configured model groups
//! with tools run in a node's workspace, and answered with one message.
//!
//! - [`state`]: the run's state graph and its one frozen terminal (the
//!   spec's S11 policy), pure logic: no I/O, no clock.
//! - [`workspace`]: the workspace admitted and frozen for a request, and
//!   its calls on the frozen link.
//! - [`model`]: a stage's model call, with no client connection.
//! - [`stages`]: what each stage asks, and the strict reading of plans and
//!   reviews; [`tools`]: the Work stage's workspace tools.
//! - [`run`]: the stages carried out, cleanup, the frozen terminal; its
//!   calls into the workspace in `calls.rs`.

mod calls;
pub mod model;
pub mod run;
pub mod stages;
pub mod state;
pub mod tools;
pub mod workspace;
