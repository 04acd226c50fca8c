//! The workspaces this node serves for the edge's single-request
//! coordinator: the catalog the edge delivers, checked against this host
//! before the node says it is ready, and the file operations inside one
//! ([`files`]), the commands run in it ([`command`]) and each request's
//! own directory there ([`jobs`]). [`Workspaces`] is the process's state
//! of them (the latest catalog, the open requests); the calls are decided
//! and run in `handler` and `cleanup`, and answered on a session's reactor
//! by [`serve`].

mod answers;
mod catalog;
mod cleanup;
pub mod command;
pub mod files;
mod handler;
pub mod jobs;
mod requests;
mod serve;
pub mod supervise;

pub use answers::label;
pub use catalog::{admit, Catalog};
pub use cleanup::{CleanupStart, CleanupTicket};
pub use handler::{ArtifactTicket, OpenTicket, Refusal, ToolTicket};
pub use requests::{Limits, Permit, Workspaces};
pub use serve::{serve, Opened};
