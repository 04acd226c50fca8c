//! `iop-loadtest report`: saved JSON reports read back into an HTML page.
//!
//! An input file is either one report of `iop-loadtest --json` (a run,
//! named after its file) or a report set, which groups reports into
//! sections and pools the rounds of one label:
//!
//! ```json
//! {"title": "...", "intro": ["a line", ...],
//!  "sections": [{"title": "S2 ...", "note": "...",
//!                "runs": [{"label": "direct", "reports": [{...}, {...}]}]}]}
//! ```
//!
//! Lone reports of all inputs form one section, before the sets' sections.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::html::{Page, RunView, Section};
use super::report::{Latencies, Report};
use super::series::{Histograms, Series};
use super::stats::Recorder;

/// Why the inputs could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SavedError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The input.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Not JSON, or not the shape of a report or a report set.
    #[error("{path}: {source}")]
    Json {
        /// The input.
        path: PathBuf,
        /// What serde said (with the line and column).
        source: serde_json::Error,
    },
    /// JSON, but neither a report nor a report set.
    #[error("{0}: neither an iop-loadtest --json report (no \"latency_us\") nor a report set (no \"sections\")")]
    Unknown(PathBuf),
}

/// The part of a `--json` report the page uses.
#[derive(Debug, Clone, Deserialize)]
pub struct SavedReport {
    #[serde(default)]
    command: String,
    elapsed_sec: f64,
    requests: u64,
    completed: u64,
    errors: SavedErrors,
    tokens: u64,
    latency_us: Option<Latencies>,
    series: Option<Series>,
}

#[derive(Debug, Clone, Deserialize)]
struct SavedErrors {
    total: u64,
}

#[derive(Debug, Deserialize)]
struct SetDoc {
    title: Option<String>,
    #[serde(default)]
    intro: Vec<String>,
    sections: Vec<SetSection>,
}

#[derive(Debug, Deserialize)]
struct SetSection {
    title: String,
    #[serde(default)]
    note: String,
    runs: Vec<SetRun>,
}

#[derive(Debug, Deserialize)]
struct SetRun {
    label: String,
    reports: Vec<SavedReport>,
}

/// One row pooling `reports` (the rounds of one run).
pub fn pool(label: &str, reports: &[SavedReport]) -> RunView {
    let mut view = RunView {
        label: label.to_owned(),
        rounds: reports.len(),
        requests: 0,
        completed: 0,
        errors: 0,
        tokens: 0,
        elapsed_sec: 0.0,
        longest_sec: 0.0,
        histograms: None,
        timeline: None,
        timeline_rounds: 0,
        latency: match reports {
            [one] => one.latency_us.clone(),
            _ => None,
        },
        commands: Vec::new(),
        warnings: Vec::new(),
    };
    let mut missing = 0;
    for (i, r) in reports.iter().enumerate() {
        view.requests += r.requests;
        view.completed += r.completed;
        view.errors += r.errors.total;
        view.tokens += r.tokens;
        view.elapsed_sec += r.elapsed_sec.max(0.0);
        view.longest_sec = view.longest_sec.max(r.elapsed_sec);
        if !r.command.is_empty() {
            view.commands.push(r.command.clone());
        }
        let Some(series) = &r.series else {
            missing += 1;
            continue;
        };
        let decoded = series.histograms().map_err(|e| e.to_string()).and_then(|h| match view.histograms.as_mut() {
            None => {
                view.histograms = Some(h);
                Ok(())
            }
            Some(all) => all.add(&h).map_err(|e| format!("cannot pool: {e:?}")),
        });
        match decoded {
            Ok(()) => match view.timeline.as_mut() {
                None => view.timeline = Some(series.timeline.clone()),
                Some(t) => t.merge(&series.timeline),
            },
            Err(e) => view.warnings.push(format!("report {}: {e}", i + 1)),
        }
    }
    if missing > 0 {
        view.warnings.push(format!(
            "{missing} of {} reports without \"series\" (an older iop-loadtest): not in the charts",
            reports.len()
        ));
    }
    view.timeline_rounds = reports.len() - missing;
    view
}

/// The row of a run just finished.
pub fn fresh(label: &str, report: &Report, recorder: &Recorder) -> RunView {
    RunView {
        label: label.to_owned(),
        rounds: 1,
        requests: report.requests,
        completed: report.completed,
        errors: report.errors.total,
        tokens: report.tokens,
        elapsed_sec: report.elapsed_sec,
        longest_sec: report.elapsed_sec,
        histograms: Some(Histograms::of(recorder)),
        timeline: Some(recorder.timeline.clone()),
        timeline_rounds: 1,
        latency: None,
        commands: Vec::new(),
        warnings: Vec::new(),
    }
}

fn stem(path: &Path) -> String {
    path.file_stem().map_or_else(|| path.display().to_string(), |s| s.to_string_lossy().into_owned())
}

/// Reads every input into one page titled `title` (else the first set's
/// title, else "iop-loadtest report").
pub fn load(inputs: &[PathBuf], title: Option<String>) -> Result<Page, SavedError> {
    let mut lone = Vec::new();
    let mut sections = Vec::new();
    let mut set_title = None;
    let mut intro = Vec::new();
    for path in inputs {
        let text = std::fs::read_to_string(path).map_err(|source| SavedError::Read { path: path.clone(), source })?;
        let json = |source| SavedError::Json { path: path.clone(), source };
        let value: serde_json::Value = serde_json::from_str(&text).map_err(json)?;
        if value.get("sections").is_some() {
            let doc: SetDoc = serde_json::from_value(value).map_err(json)?;
            set_title = set_title.or(doc.title);
            intro.extend(doc.intro);
            for s in doc.sections {
                let runs = s.runs.iter().map(|r| pool(&r.label, &r.reports)).collect();
                sections.push(Section { title: s.title, note: s.note, runs });
            }
        } else if value.get("latency_us").is_some() {
            let report: SavedReport = serde_json::from_value(value).map_err(json)?;
            lone.push((stem(path), report));
        } else {
            return Err(SavedError::Unknown(path.clone()));
        }
    }
    if !lone.is_empty() {
        let runs = lone.iter().map(|(label, r)| pool(label, std::slice::from_ref(r))).collect();
        sections.insert(0, Section { title: String::new(), note: String::new(), runs });
    }
    Ok(Page { title: title.or(set_title).unwrap_or_else(|| "iop-loadtest report".to_owned()), intro, sections })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::load::stats::Measure;

    fn report_json(ms: u64, secs: u64) -> serde_json::Value {
        let mut r = Recorder::new().unwrap();
        for i in 0..10 {
            r.ok(&Measure {
                ttft: Some(Duration::from_millis(ms)),
                total: Duration::from_millis(ms * 2),
                gaps_us: vec![100 * i],
                tokens: 2,
                ..Measure::default()
            });
            r.timeline.ok(Duration::from_millis(100 * i), 2);
        }
        serde_json::json!({
            "command": format!("iop-loadtest --ms {ms}"),
            "elapsed_sec": secs as f64,
            "requests": 10, "completed": 10, "errors": {"total": 0}, "tokens": 20,
            "latency_us": serde_json::from_str::<serde_json::Value>(&serde_json::to_string(&Latencies {
                ttfb: crate::load::report::Summary::of(&r.ttfb),
                ttft: crate::load::report::Summary::of(&r.ttft),
                total: crate::load::report::Summary::of(&r.total),
                itl: crate::load::report::Summary::of(&r.itl),
            }).unwrap()).unwrap(),
            "series": serde_json::to_value(Series::of(&r)).unwrap(),
        })
    }

    #[test]
    fn pools_rounds_and_reads_sets() {
        let dir = std::env::temp_dir().join(format!("iop-saved-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lone = dir.join("fast.json");
        std::fs::write(&lone, report_json(10, 1).to_string()).unwrap();
        let mut old = report_json(30, 1);
        old.as_object_mut().unwrap().remove("series");
        let set = dir.join("set.json");
        let doc = serde_json::json!({
            "title": "bench",
            "intro": ["machine x"],
            "sections": [{"title": "S2", "note": "n", "runs": [
                {"label": "a", "reports": [report_json(10, 1), report_json(20, 2)]},
                {"label": "old", "reports": [old]},
            ]}],
        });
        std::fs::write(&set, doc.to_string()).unwrap();
        let page = load(&[set.clone(), lone.clone()], None).unwrap();
        assert_eq!(page.title, "bench");
        assert_eq!(page.intro, ["machine x"]);
        assert_eq!(page.sections.len(), 2);
        assert_eq!(page.sections[0].runs[0].label, "fast", "lone reports first, named after the file");
        let a = &page.sections[1].runs[0];
        assert_eq!((a.rounds, a.completed, a.elapsed_sec, a.longest_sec), (2, 20, 3.0, 2.0));
        let h = a.histograms.as_ref().unwrap();
        assert_eq!(h.ttft.len(), 20, "pooled");
        assert_eq!(a.timeline.as_ref().unwrap().completed, [20]);
        assert_eq!(a.commands.len(), 2);
        let old = &page.sections[1].runs[1];
        assert!(old.histograms.is_none() && old.latency.is_some());
        assert!(old.warnings[0].contains("without \"series\""), "{:?}", old.warnings);

        let html = super::super::html::render(&page);
        assert!(html.contains("<h2 id=\"s2\">S2</h2>"), "{html}");
        assert_eq!(html.matches("<svg").count(), 8, "4 charts in each of 2 sections");

        assert_eq!(load(&[set], Some("t".into())).unwrap().title, "t");
        let bad = dir.join("bad.json");
        std::fs::write(&bad, "{\"x\": 1}").unwrap();
        assert!(load(std::slice::from_ref(&bad), None).unwrap_err().to_string().contains("neither"));
        std::fs::write(&bad, "{\"latency_us\": 1}").unwrap();
        assert!(matches!(load(std::slice::from_ref(&bad), None), Err(SavedError::Json { .. })));
        assert!(matches!(load(&[dir.join("missing.json")], None), Err(SavedError::Read { .. })));
        std::fs::remove_dir_all(&dir).ok();
    }
}
