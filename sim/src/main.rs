//! `iop-sim`: runs the capacity-share simulation at the size (or
//! another) and its one-edge baseline, and prints both as JSON lines.

use std::time::Instant;

use clap::Parser;
use iop_sim::{baseline, Params, Sim};

#[derive(Parser)]
#[command(about = "Deterministic simulation of capacity shares across edges and nodes")]
struct Args {
    /// The CI form (seconds) instead of the full size.
    #[arg(long)]
    reduced: bool,
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long)]
    nodes: Option<usize>,
    #[arg(long)]
    edges: Option<usize>,
    /// Simulated seconds.
    #[arg(long)]
    seconds: Option<f64>,
    #[arg(long)]
    requests_per_minute: Option<f64>,
    /// No edges or nodes joining, leaving or flapping.
    #[arg(long)]
    no_churn: bool,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let mut p = if a.reduced { Params::reduced() } else { Params::full() };
    p.seed = a.seed.unwrap_or(p.seed);
    p.nodes = a.nodes.unwrap_or(p.nodes);
    p.edges = a.edges.unwrap_or(p.edges);
    p.seconds = a.seconds.unwrap_or(p.seconds);
    p.requests_per_minute = a.requests_per_minute.unwrap_or(p.requests_per_minute);
    p.churn &= !a.no_churn;
    for (name, params) in [("shares", p.clone()), ("one_edge", baseline(&p))] {
        let started = Instant::now();
        let r = Sim::new(params)?.run();
        let wall = started.elapsed().as_secs_f64();
        let mut line = r.to_json();
        line["run"] = name.into();
        line["wall_s"] = wall.into();
        line["simulated_per_wall"] = (r.simulated_s / wall).into();
        let text = serde_json::to_string(&line)?;
        std::io::Write::write_all(&mut std::io::stdout(), format!("{text}\n").as_bytes())?;
    }
    Ok(())
}
