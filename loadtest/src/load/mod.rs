//! `iop-loadtest`: a load generator for OpenAI chat completions over HTTP/1.1,
//! streamed (SSE) or not, built on the same sans-IO codecs as the gateway
//! (`iop_core::http`, `iop_core::sse`) and on monoio.
//!
//! - [`args`]: the command line ([`LoadArgs`]) and its validated form ([`Settings`]).
//! - [`exchange`]: one request/response without I/O: timings and validation.
//! - [`stats`]: HDR histograms and error classes ([`Recorder`], [`Failure`]).
//! - [`timeline`]: completions, errors and tokens per second of the run.
//! - [`report`]: the text and JSON report; [`series`]: the distributions
//!   in the JSON (HdrHistogram V2, base64), read back by [`saved`].
//! - [`progress`]: the progress line on a terminal.
//! - [`dist`] (CDF and histogram bins), [`plots`] (SVG charts, plotters) and
//!   [`html`] (the self-contained page): the HTML report of `--html` and of
//!   `iop-loadtest report`.
//! - `conn`: the connection tasks.
//!
//! [`run`] starts `workers` threads, each with its own monoio runtime driving
//! its share of the `concurrency` keep-alive connections; they share nothing
//! but an atomic request counter (and, on a terminal, the progress line's
//! atomic counters). Each thread keeps its own [`Recorder`]; they are merged
//! when all have finished.

pub mod api;
pub mod args;
mod conn;
pub mod dist;
pub mod exchange;
pub mod html;
pub mod plots;
pub mod progress;
pub mod report;
pub mod saved;
pub mod series;
pub mod stats;
pub mod timeline;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

pub use args::{LoadArgs, Settings};
pub use report::Report;
pub use stats::{Failure, Recorder};

use conn::{Budget, WorkerCtx};

/// What a finished run measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Merged measurements of every worker.
    pub recorder: Recorder,
    /// From the start of the first worker to the end of the last.
    pub elapsed: Duration,
    /// monoio driver (`io_uring` or `epoll`).
    pub driver: &'static str,
}

type WorkerResult = anyhow::Result<(Recorder, &'static str)>;

/// Holds the workers until every runtime is built, so they start together.
#[derive(Debug, Default)]
struct Gate {
    /// `None` while closed; `Some(start)` once opened (`Some(None)` = abort).
    state: Mutex<Option<Option<Instant>>>,
    opened: Condvar,
}

impl Gate {
    /// Opens with the run's start instant, or `None` to abort.
    fn open(&self, go: Option<Instant>) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = Some(go);
        self.opened.notify_all();
    }

    /// Waits until opened; the start instant to go ahead.
    fn wait(&self) -> Option<Instant> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(go) = *state {
                return go;
            }
            state = self.opened.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Runs the load described by `settings` and waits for it to finish.
pub fn run(settings: &Settings) -> anyhow::Result<Outcome> {
    let workers = settings.workers.get();
    let budget = Arc::new(Budget::new(settings.bounds.requests));
    let requests = settings.requests();
    let gate = Arc::new(Gate::default());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    // Nothing is sent: each worker holds a sender until it returns, so the
    // channel disconnects when the last one is done.
    let (done_tx, done_rx) = std::sync::mpsc::sync_channel::<()>(1);
    let live = settings.progress.then(|| Arc::new(progress::Live::new()));
    let mut handles = Vec::with_capacity(workers);
    for index in 0..workers {
        let connections = settings.connections_of(index);
        let (budget, worker_gate, ready, requests) = (budget.clone(), gate.clone(), ready_tx.clone(), requests.clone());
        let (done, live) = (done_tx.clone(), live.clone());
        let (addr, api, stream, timeout, duration) =
            (settings.addr, settings.api, settings.stream, settings.timeout, settings.bounds.duration);
        let (rate, disconnect_after) = (settings.rate, settings.disconnect_after);
        let firsts: Vec<Duration> = (0..connections).map(|j| settings.first_request_after(index, j)).collect();
        let spawned =
            std::thread::Builder::new().name(format!("iop-loadtest-{index}")).spawn(move || -> WorkerResult {
                let _done = done;
                let rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new().enable_timer().build();
                let _ = ready.send(());
                let Some(start) = worker_gate.wait() else {
                    return Err(anyhow::anyhow!("run aborted"));
                };
                let mut rt = rt?;
                let driver = match rt {
                    monoio::FusionRuntime::Uring(_) => "io_uring",
                    monoio::FusionRuntime::Legacy(_) => "epoll",
                };
                let ctx = Rc::new(WorkerCtx {
                    addr,
                    requests,
                    api,
                    stream,
                    schedule: rate.map(|rate| conn::Schedule { start, rate }),
                    disconnect_after,
                    timeout,
                    budget,
                    deadline: duration.map(|d| start + d),
                    recorder: RefCell::new(Recorder::new()?),
                    start,
                    live,
                });
                rt.block_on(async {
                    let tasks: Vec<_> =
                        firsts.iter().map(|&after| monoio::spawn(conn::drive(ctx.clone(), start + after))).collect();
                    for task in tasks {
                        task.await;
                    }
                });
                let recorder = ctx.recorder.borrow().clone();
                Ok((recorder, driver))
            });
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(e) => {
                gate.open(None);
                for handle in handles {
                    let _ = handle.join();
                }
                return Err(anyhow::anyhow!("cannot start worker thread {index}: {e}"));
            }
        }
    }
    drop(ready_tx);
    // Every worker reports once, after building its runtime (or failing to).
    for _ in 0..workers {
        if ready_rx.recv().is_err() {
            break;
        }
    }
    drop(done_tx);
    let start = Instant::now();
    gate.open(Some(start));
    if let Some(live) = &live {
        let what = if settings.stream { "ttft" } else { "latency" };
        // Not a held lock: workers may log to stderr meanwhile.
        progress::show(live, &done_rx, start, settings.bounds, what, &mut std::io::stderr());
    }
    let results: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
    let elapsed = start.elapsed();
    let mut merged = Recorder::new()?;
    let mut driver = "unknown";
    for result in results {
        match result {
            Ok(Ok((recorder, d))) => {
                merged.merge(&recorder)?;
                driver = d;
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(anyhow::anyhow!("a worker thread panicked")),
        }
    }
    Ok(Outcome { recorder: merged, elapsed, driver })
}
