//! `iop-edge`: parse the CLI and config, start the workers, wait for a signal.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use iop_core::config::EdgeConfig;

/// jemalloc, with its background purge thread: freed memory goes back to
/// the OS after a burst (glibc's per-thread arenas and growing mmap
/// threshold kept tens of MiB after a burst of large request bodies), and
/// frees from other threads take no arena lock.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// iop edge: OpenAI-compatible gateway in front of a fleet of iop nodes.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Path to the edge TOML config.
    #[arg(long, short)]
    config: PathBuf,
    /// Validate the config and exit.
    #[arg(long)]
    check_config: bool,
}

fn main() {
    // The embedded node's workspace commands are supervised by this binary.
    iop_node::workspace::supervise::run_if_asked();
    if let Err(e) = run() {
        eprintln!("iop-edge: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let _log_writer = init_tracing();
    if let Err(e) = iop_core::rt::alloc::tune_jemalloc() {
        tracing::warn!(error = %e, "jemalloc tuning failed: freed memory returns to the OS more slowly");
    }
    let config = load(&args.config)?;
    // The TLS files too: a check passes only when the edge would start.
    iop_edge::load_tls(&config).with_context(|| format!("invalid config {}", args.config.display()))?;
    if args.check_config {
        eprintln!("config {} is valid", args.config.display());
        return Ok(());
    }
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]).context("cannot install signal handlers")?;
    let edge = iop_edge::start(config)?;
    // The ready line: tests and scripts read the bound addresses from it.
    #[allow(clippy::print_stdout)]
    {
        println!("iop-edge ready http={} nodes={} driver={}", edge.http_addr, edge.node_addr, edge.driver.name());
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // This thread is not a reactor: reading the file here blocks nobody.
    for sig in signals.forever() {
        if sig == SIGHUP {
            tracing::info!(path = %args.config.display(), "SIGHUP: reloading the config");
            match load(&args.config) {
                Ok(config) => {
                    if let Err(e) = edge.reload(config) {
                        edge.reject_reload(e.to_string());
                    }
                }
                Err(e) => edge.reject_reload(format!("{e:#}")),
            }
            continue;
        }
        break;
    }
    let grace = edge.shutdown_grace();
    tracing::info!(
        active = edge.active_requests(),
        grace_sec = grace.as_secs(),
        "shutting down: draining client requests"
    );
    edge.shutdown();
    // Wait for requests in flight; a second SIGINT/SIGTERM stops at once.
    let deadline = std::time::Instant::now() + grace;
    while edge.active_requests() > 0 {
        if std::time::Instant::now() >= deadline {
            tracing::warn!(active = edge.active_requests(), "drain deadline passed; exiting");
            break;
        }
        if signals.pending().any(|s| s != SIGHUP) {
            tracing::warn!(active = edge.active_requests(), "second signal; exiting now");
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}

fn load(path: &std::path::Path) -> anyhow::Result<EdgeConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config {}", path.display()))?;
    EdgeConfig::from_toml(&text, &|k| std::env::var(k).ok())
        .with_context(|| format!("invalid config {}", path.display()))
}

/// Logs go to stderr from a thread of their own: a reactor never blocks on
/// a slow log reader (a full buffer drops lines rather than wait). The
/// guard flushes what is queued when `run` returns.
fn init_tracing() -> tracing_appender::non_blocking::WorkerGuard {
    let filter = tracing_subscriber::EnvFilter::try_from_env("IOP_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // 4096 queued lines, not the default 128 000 (a 4 MB table touched at start).
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .buffered_lines_limit(4096)
        .finish(std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    guard
}
