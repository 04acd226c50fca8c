//! End-to-end tests: the real `iop-edge`, `iop-node` and `iop-mockprov`
//! binaries on port 0 over real sockets. One test binary, several modules.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::print_stdout)]

mod attack;
mod harness;
mod pki;

mod admin;
mod admin_page;
mod affinity;
pub mod agent;
mod agent_faults;
mod agent_ollama;
mod agent_sdk;
mod api_keys;
mod chat;
mod cluster_limits;
mod commands;
mod errors;
mod faults;
mod hostile_http;
mod hostile_limits;
mod hostile_peers;
mod http_rfc;
mod leases;
mod lifecycle;
mod links;
pub mod messages;
mod metrics;
mod multi_edge;
mod ollama;
mod placement;
mod pool;
mod real_upstream;
mod recovery;
mod responses;
mod responses_ws;
mod robustness;
mod runs;
pub mod sdk_fidelity;
mod secrets;
mod slow_readers;
mod stall;
mod suspect;
mod terminal;
mod tls;
mod tunnel;
mod workspaces;
