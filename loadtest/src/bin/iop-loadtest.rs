//! `iop-loadtest`: SSE load generator for OpenAI chat completions. Prints the
//! report (text, or one JSON object with `--json`) on stdout, and with
//! `--html` also writes it as an HTML page with plots; logs and errors go
//! to stderr, and so does the progress line when stderr is a terminal.
//! `iop-loadtest report --html OUT JSON...` renders saved reports instead.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use iop_loadtest::load::args::{Command, ReportArgs};
use iop_loadtest::load::{self, html, report::command_line, saved, LoadArgs, Report, Settings};
use tracing_subscriber::EnvFilter;

#[allow(clippy::print_stdout)]
fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("IOP_LOG").unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = LoadArgs::parse();
    if let Some(Command::Report(r)) = &args.command {
        return report(r);
    }
    let mut settings = match Settings::from_args(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("iop-loadtest: {e}");
            return ExitCode::from(2);
        }
    };
    settings.progress = std::io::stderr().is_terminal();
    // Opened before the run, so that a bad path fails now and not after it.
    let mut html_file = match &args.html {
        Some(path) => match std::fs::File::create(path) {
            Ok(f) => Some((path, f)),
            Err(e) => {
                eprintln!("iop-loadtest: --html {}: {e}", path.display());
                return ExitCode::from(2);
            }
        },
        None => None,
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
    if let Some((path, file)) = &mut html_file {
        let page = html::Page {
            title: "iop-loadtest report".to_owned(),
            intro: report.to_text().lines().map(str::to_owned).collect(),
            sections: vec![html::Section {
                title: String::new(),
                note: String::new(),
                runs: vec![saved::fresh("run", &report, &outcome.recorder)],
            }],
        };
        if let Err(e) = file.write_all(html::render(&page).as_bytes()) {
            eprintln!("iop-loadtest: --html {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// `iop-loadtest report`: saved reports to one HTML page.
fn report(args: &ReportArgs) -> ExitCode {
    let page = match saved::load(&args.inputs, args.title.clone()) {
        Ok(page) => page,
        Err(e) => {
            eprintln!("iop-loadtest report: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = std::fs::write(&args.html, html::render(&page)) {
        eprintln!("iop-loadtest report: --html {}: {e}", args.html.display());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
