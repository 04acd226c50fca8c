//! `iop-mockprov`: mock OpenAI-compatible upstream. Prints exactly one line,
//! `iop-mockprov listening on <addr>`, to stdout once bound; logs go to stderr.

use std::io::{IsTerminal, Write};

use clap::Parser;
use iop_loadtest::mockprov::{run_blocking, MockConfig};
use tracing_subscriber::EnvFilter;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("IOP_LOG").unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let config = MockConfig::parse();
    run_blocking(config, |addr, _stats| {
        // Tests wait for this line to learn the real port; flush it at once.
        let mut out = std::io::stdout().lock();
        if let Err(e) = writeln!(out, "iop-mockprov listening on {addr}").and_then(|()| out.flush()) {
            tracing::error!(error = %e, "cannot announce the listening address on stdout");
        }
    })?;
    Ok(())
}
