//! `iop-loadtest`: SSE load generator for OpenAI chat completions. Prints the
//! report (text, or one JSON object with `--json`) on stdout; logs and
//! errors go to stderr.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use iop_loadtest::load::{self, report::command_line, LoadArgs, Report, Settings};
use tracing_subscriber::EnvFilter;

#[allow(clippy::print_stdout)]
fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("IOP_LOG").unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = LoadArgs::parse();
    let settings = match Settings::from_args(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("iop-loadtest: {e}");
            return ExitCode::from(2);
        }
    };
    let outcome = match load::run(&settings) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("iop-loadtest: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let report = Report::new(&settings, &outcome, command_line(std::env::args()));
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    ExitCode::SUCCESS
}
