//! End-to-end tests: the real `iop-edge`, `iop-node` and `iop-mockprov`
//! binaries on port 0 over real sockets. One test binary, several modules.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::print_stdout)]

mod harness;

mod admin;
mod chat;
mod errors;
mod faults;
mod lifecycle;
mod pool;
mod real_upstream;
mod robustness;
