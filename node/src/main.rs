//! `iop-node`: parse the CLI and config, run the node until a signal.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use iop_core::{config::NodeConfig, rt};
use iop_node::NodeError;

/// jemalloc, with its background purge thread: freed memory goes back to
/// the OS after a burst (glibc's per-thread arenas and growing mmap
/// threshold kept tens of MiB after a burst of large request bodies), and
/// frees from other threads take no arena lock.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// iop node: runs beside model servers and executes requests for the edge.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Path to the node TOML config.
    #[arg(long, short)]
    config: PathBuf,
    /// Validate the config and exit.
    #[arg(long)]
    check_config: bool,
}

fn main() {
    // A workspace command's supervisor is this binary started again.
    iop_node::workspace::supervise::run_if_asked();
    match run() {
        Ok(()) => {}
        Err(e) => {
            eprintln!("iop-node: {e:#}");
            let code = match e.downcast_ref::<NodeError>() {
                Some(NodeError::Fatal(_)) => 2,
                Some(NodeError::Exhausted { .. }) => 3,
                None => 1,
            };
            std::process::exit(code);
        }
    }
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("IOP_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // From a thread of its own: a reactor never blocks on a slow log reader.
    let (writer, _log_writer) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .buffered_lines_limit(4096)
        .finish(std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Err(e) = iop_core::rt::alloc::tune_jemalloc() {
        tracing::warn!(error = %e, "jemalloc tuning failed: freed memory returns to the OS more slowly");
    }
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("cannot read config {}", args.config.display()))?;
    let config = NodeConfig::from_toml(&text, &|k| std::env::var(k).ok())
        .with_context(|| format!("invalid config {}", args.config.display()))?;
    let tls = iop_node::edge_tls(&config).with_context(|| format!("invalid config {}", args.config.display()))?;
    if args.check_config {
        eprintln!("config {} is valid", args.config.display());
        return Ok(());
    }
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])
        .context("cannot install signal handlers")?;
    tracing::info!(driver = rt::Driver::detect().name(), edges = ?config.edges, workers = config.workers, "iop-node starting");
    if let Some(addr) = config.metrics_listen {
        let bound =
            iop_node::metrics::serve(addr).with_context(|| format!("cannot listen on metrics_listen {addr}"))?;
        tracing::info!(addr = %bound, "node metrics at GET /metrics");
        // The bound address (port 0 picks one), for scripts and tests.
        #[allow(clippy::print_stdout)]
        {
            println!("iop-node metrics http={bound}");
        }
        let _ = std::io::Write::flush(&mut std::io::stdout());
    }
    let pin = config.pin_workers;
    let node =
        iop_node::start(config, pin, tls).context("cannot start the node (its run store, its worker threads)")?;
    let stopper = node.stopper();
    std::thread::Builder::new()
        .name("iop-node-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                tracing::info!(signal = sig, "shutting down");
                stopper.stop();
            }
        })
        .context("cannot start the signal thread")?;
    node.wait().map_err(anyhow::Error::from)
}
