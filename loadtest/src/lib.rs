//! iop-loadtest: load-testing tools for iop.
//!
//! - [`mockprov`]: `iop-mockprov`, a mock OpenAI-compatible model server
//!   (vLLM / llama.cpp shaped SSE) with per-request behaviour overrides, used
//!   by end-to-end tests and load tests as the upstream provider.

pub mod mockprov;
