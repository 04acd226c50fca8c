//! The connectivity supervisor: one policy for the initial connect and
//! every reconnect; only shutdown, fatal errors and exhaustion end it.

use std::time::Duration;

use iop_core::{config::NodeConfig, rt::signal::LocalCancel};

use crate::{
    process::LinkSpec,
    session::{self, SessionEnd},
};

/// Why the node stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Retrying cannot help (unknown token, invalid config).
    #[error("{0}")]
    Fatal(String),
    /// The reconnect policy's attempts are used up.
    #[error("gave up after {attempts} failed connection attempts: {last}")]
    Exhausted {
        /// Consecutive failed attempts.
        attempts: u32,
        /// The last failure.
        last: String,
    },
}

/// Connects and reconnects one link until shutdown, a fatal error, or
/// exhaustion.
pub async fn supervise(cfg: NodeConfig, link: LinkSpec, shutdown: LocalCancel) -> Result<(), NodeError> {
    let mut failures: u32 = 0;
    loop {
        let end = session::run(&cfg, &link, &shutdown).await;
        let reason = match end {
            SessionEnd::Shutdown => return Ok(()),
            SessionEnd::Fatal(msg) => return Err(NodeError::Fatal(msg)),
            // Losing a ready session is not a failed attempt: the count of
            // consecutive failures starts over from the next try.
            SessionEnd::Retry { established: true, reason } => {
                failures = 0;
                reason
            }
            SessionEnd::Retry { established: false, reason } => {
                failures += 1;
                if let Some(max) = cfg.reconnect.max_attempts {
                    if failures >= max {
                        return Err(NodeError::Exhausted { attempts: failures, last: reason });
                    }
                }
                reason
            }
        };
        let delay = jittered(cfg.reconnect.interval);
        tracing::warn!(link = link.index, attempt = failures, %reason, retry_in_ms = delay.as_millis() as u64, "edge connection failed");
        monoio::select! {
            _ = monoio::time::sleep(delay) => {}
            _ = shutdown.cancelled() => return Ok(()),
        }
    }
}

/// `base` ± 20 %, so a fleet of nodes does not reconnect in lockstep.
fn jittered(base: Duration) -> Duration {
    let ms = base.as_millis().min(u128::from(u32::MAX)) as u32;
    let spread = ms / 5;
    if spread == 0 {
        return base;
    }
    let offset = monoio::utils::thread_rng_n(spread * 2);
    Duration::from_millis(u64::from(ms - spread + offset))
}
