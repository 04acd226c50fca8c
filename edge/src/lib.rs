//! iop-edge: the front door. Serves the OpenAI API to clients, accepts node
//! connections, and dispatches each request to a ready node.
//!
//! - [`start`] binds the listeners and starts one worker per core ([`worker`]).
//! - [`mesh`]: the messages between cores, which core owns a resource or
//!   serves a node's link, and [`mesh::post`]; [`link`]: how any core
//!   reaches a ready node's links.
//! - [`transport`]: node sessions (register → ready → runs), [`registry`]:
//!   which connection generation owns each node.
//! - [`dispatch`]: model → node, run submission and the run event stream.
//! - [`server`] + [`surface`]: HTTP/1.1 connections and the OpenAI surface.
//! - [`accept`] + [`limits`]: what an unauthenticated peer may hold or try
//!   (handshake slots, TLS handshakes, failed credentials), per address.
//! - [`coordinator`]: the single-request coordinator (being built).

pub mod accept;
pub mod budget;
pub mod cluster;
pub mod coordinator;
pub mod credentials;
pub mod ctx;
pub mod dispatch;
pub mod events;
pub mod health_probe;
pub mod limits;
pub mod link;
pub mod mesh;
pub mod metrics;
pub mod node_config;
pub mod pool;
pub mod registry;
pub mod run_item;
pub mod run_stream;
pub mod server;
pub mod shared;
mod start;
pub mod stream;
pub mod surface;
pub mod transport;
pub mod worker;
pub mod workspaces;

pub use start::{load_tls, start, EdgeHandle, ReloadError, StartError};
