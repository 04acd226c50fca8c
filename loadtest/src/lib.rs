//! iop-loadtest: load-testing tools for iop.
//!
//! - [`mockprov`]: `iop-mockprov`, a mock OpenAI-compatible model server
//!   (vLLM / llama.cpp shaped SSE) with per-request behaviour overrides, used
//!   by end-to-end tests and load tests as the upstream provider.
//! - [`load`]: `iop-loadtest`, an SSE load generator for OpenAI chat
//!   completions (monoio, HDR-histogram percentiles of TTFT, total and
//!   inter-token latency, errors by class).

pub mod load;
pub mod mockprov;
