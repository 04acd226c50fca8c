//! The HTML report: one self-contained page (inline SVG and CSS; no script,
//! no link, no font, nothing fetched when it is viewed) with a table of the
//! runs and, per section, four charts: the latency CDF, the TTFT and
//! inter-token gap histograms and the throughput over time. Several runs in
//! a section share each chart, one line per run.

use std::fmt::Write as _;

use super::plots::{self, Chart};
use super::report::{Latencies, Summary};
use super::series::Histograms;
use super::timeline::Timeline;

/// The chart titles, in page order (the figures' ids are their slugs).
pub const TITLES: [&str; 4] = ["Latency CDF", "TTFT histogram", "Inter-token gap histogram", "Throughput over time"];

/// One row of a section: a run, or the rounds of one system pooled.
#[derive(Debug, Clone)]
pub struct RunView {
    /// Name in the table and the legends.
    pub label: String,
    /// Reports pooled into this row.
    pub rounds: usize,
    /// Requests started (all rounds).
    pub requests: u64,
    /// Valid responses.
    pub completed: u64,
    /// Failed requests.
    pub errors: u64,
    /// Tokens received.
    pub tokens: u64,
    /// Sum of the rounds' elapsed times, seconds.
    pub elapsed_sec: f64,
    /// The longest round, seconds (the timeline's extent).
    pub longest_sec: f64,
    /// The distributions (pooled), when the reports carried them.
    pub histograms: Option<Histograms>,
    /// Completions over time (summed over the rounds that had one).
    pub timeline: Option<Timeline>,
    /// The rounds summed in `timeline`.
    pub timeline_rounds: usize,
    /// The saved percentiles, for a lone report without distributions.
    pub latency: Option<Latencies>,
    /// The command of each round.
    pub commands: Vec<String>,
    /// What could not be used.
    pub warnings: Vec<String>,
}

/// A group of runs drawn on the same charts.
#[derive(Debug, Clone)]
pub struct Section {
    /// Heading (empty: none).
    pub title: String,
    /// A line under the heading.
    pub note: String,
    /// The runs.
    pub runs: Vec<RunView>,
}

/// A whole page.
#[derive(Debug, Clone)]
pub struct Page {
    /// `<title>` and heading.
    pub title: String,
    /// Preformatted text under the heading (a run's text report, a benchmark's header).
    pub intro: Vec<String>,
    /// The sections.
    pub sections: Vec<Section>,
}

/// Escapes text for HTML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `Latency CDF` → `latency-cdf`.
pub fn slug(title: &str) -> String {
    title
        .to_ascii_lowercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:62em;padding:0 1em;color:#222}\
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}\
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:.85em}\
table{border-collapse:collapse;font-size:.85em;margin:.8em 0}th,td{padding:.25em .6em;border-bottom:1px solid #ddd}\
td{text-align:right}td:first-child,th:first-child{text-align:left}th{background:#f0f0f0}\
figure{margin:1em 0}svg{max-width:100%;height:auto}.none,.warn{color:#777;font-style:italic}";

impl RunView {
    /// The percentiles of one measure: from the histograms, else the saved ones.
    fn summary(
        &self,
        pick: fn(&Histograms) -> &hdrhistogram::Histogram<u64>,
        saved: fn(&Latencies) -> &Summary,
    ) -> Option<Summary> {
        match (&self.histograms, &self.latency) {
            (Some(h), _) => Some(Summary::of(pick(h))),
            (None, Some(l)) => Some(saved(l).clone()),
            (None, None) => None,
        }
    }
}

fn ms(s: &Option<Summary>, at: fn(&Summary) -> u64) -> String {
    match s {
        Some(s) if s.count > 0 => format!("{:.3}", at(s) as f64 / 1000.0),
        _ => "n/a".to_owned(),
    }
}

fn rate(n: u64, secs: f64) -> String {
    if secs > 0.0 {
        format!("{:.1}", n as f64 / secs)
    } else {
        "n/a".to_owned()
    }
}

fn table(out: &mut String, runs: &[RunView]) {
    let pooled = runs.iter().any(|r| r.rounds > 1);
    let mut head = vec!["run"];
    if pooled {
        head.push("rounds");
    }
    head.extend([
        "requests",
        "ok",
        "errors",
        "seconds",
        "req/s",
        "tokens/s",
        "TTFT p50",
        "TTFT p99",
        "gap p50",
        "gap p99",
        "total p50",
        "total p99",
    ]);
    out.push_str("<table><tr>");
    for h in head {
        let _ = write!(out, "<th>{}</th>", escape(h));
    }
    out.push_str("</tr>\n");
    for r in runs {
        let ttft = r.summary(|h| &h.ttft, |l| &l.ttft);
        let itl = r.summary(|h| &h.itl, |l| &l.itl);
        let total = r.summary(|h| &h.total, |l| &l.total);
        let mut cells = vec![escape(&r.label)];
        if pooled {
            cells.push(r.rounds.to_string());
        }
        cells.extend([
            r.requests.to_string(),
            r.completed.to_string(),
            r.errors.to_string(),
            format!("{:.3}", r.elapsed_sec),
            rate(r.completed, r.elapsed_sec),
            rate(r.tokens, r.elapsed_sec),
            ms(&ttft, |s| s.p50),
            ms(&ttft, |s| s.p99),
            ms(&itl, |s| s.p50),
            ms(&itl, |s| s.p99),
            ms(&total, |s| s.p50),
            ms(&total, |s| s.p99),
        ]);
        out.push_str("<tr>");
        for c in cells {
            let _ = write!(out, "<td>{c}</td>");
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
    let mut notes = vec![
        "Latencies in ms; a gap is 0 when two token deltas arrive in one read (drawn at 0.001 ms on a log axis). \
         req/s and tokens/s: completions over the run's time.",
    ];
    if pooled {
        notes.push(
            "Rounds are pooled: percentiles and charts of all rounds' values together, req/s over all rounds' time, \
             throughput over time their mean.",
        );
    }
    let _ = writeln!(out, "<p class=\"none\">{}</p>", escape(&notes.join(" ")));
}

/// The four charts of a section (`None` where no run has values).
pub fn charts(runs: &[RunView]) -> [Option<Chart>; 4] {
    let with: Vec<(&str, &Histograms)> =
        runs.iter().filter_map(|r| r.histograms.as_ref().map(|h| (r.label.as_str(), h))).collect();
    let cdf: Vec<_> = with.iter().map(|(l, h)| (*l, &h.ttft, &h.total)).collect();
    let ttft: Vec<_> = with.iter().map(|(l, h)| (*l, &h.ttft)).collect();
    let itl: Vec<_> = with.iter().map(|(l, h)| (*l, &h.itl)).collect();
    let timelines: Vec<_> = runs
        .iter()
        .filter_map(|r| r.timeline.as_ref().map(|t| (r.label.as_str(), t, r.longest_sec, r.timeline_rounds.max(1))))
        .collect();
    [
        plots::latency_cdf(&cdf),
        plots::histogram(TITLES[1], "time to first token (ms)", &ttft),
        plots::histogram(TITLES[2], "gap between token deltas (ms)", &itl),
        plots::throughput(&timelines),
    ]
}

/// The page.
pub fn render(page: &Page) -> String {
    let mut out = String::with_capacity(64 * 1024);
    let title = escape(&page.title);
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>{title}</title><style>{STYLE}</style></head><body>\n<h1>{title}</h1>\n"
    );
    if !page.intro.is_empty() {
        let _ = writeln!(out, "<pre>{}</pre>", escape(&page.intro.join("\n")));
    }
    for (n, section) in page.sections.iter().enumerate() {
        if !section.title.is_empty() {
            let _ = writeln!(out, "<h2 id=\"s{}\">{}</h2>", n + 1, escape(&section.title));
        }
        if !section.note.is_empty() {
            let _ = writeln!(out, "<p>{}</p>", escape(&section.note));
        }
        table(&mut out, &section.runs);
        for r in &section.runs {
            for w in &r.warnings {
                let _ = writeln!(out, "<p class=\"warn\">{}: {}</p>", escape(&r.label), escape(w));
            }
        }
        for (chart, title) in charts(&section.runs).iter().zip(TITLES) {
            let id = format!("s{}-{}", n + 1, slug(title));
            match chart.as_ref().map(Chart::svg) {
                Some(Ok(svg)) => {
                    let _ = writeln!(out, "<figure id=\"{id}\">{svg}</figure>");
                }
                Some(Err(e)) => {
                    let _ = writeln!(out, "<p class=\"warn\" id=\"{id}\">{}</p>", escape(&e.to_string()));
                }
                None => {
                    let _ = writeln!(out, "<p class=\"none\" id=\"{id}\">{}: no values.</p>", escape(title));
                }
            }
        }
        let commands: Vec<String> =
            section.runs.iter().flat_map(|r| r.commands.iter().map(move |c| format!("{}: {c}", r.label))).collect();
        if !commands.is_empty() {
            let _ = writeln!(
                out,
                "<details><summary>commands</summary><pre>{}</pre></details>",
                escape(&commands.join("\n"))
            );
        }
    }
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_slugs() {
        assert_eq!(escape("a<b & \"c\" 'd'>"), "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt;");
        assert_eq!(slug("Inter-token gap histogram"), "inter-token-gap-histogram");
        assert_eq!(
            TITLES.map(slug),
            ["latency-cdf", "ttft-histogram", "inter-token-gap-histogram", "throughput-over-time"]
        );
    }
}
