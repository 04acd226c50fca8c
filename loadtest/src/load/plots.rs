//! The report's charts as SVG, drawn with plotters' SVG backend: plain
//! `<svg>` text with `<text>` labels in the viewer's sans-serif font (no
//! font files, no bitmaps, nothing fetched when the page is viewed).
//!
//! A [`Chart`] is built from the data first (pure, tested), then drawn by
//! [`Chart::svg`]. Several runs on one chart share its axes: one line each.

use std::ops::Range;

use hdrhistogram::Histogram;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

use super::dist::{self, Bins};
use super::timeline::Timeline;

/// Chart size in pixels (the page scales it down to its width).
const SIZE: (u32, u32) = (760, 380);
/// Line colours (matplotlib's tab10), one per run.
const PALETTE: [(u8, u8, u8); 8] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
];

/// Why a chart could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw {title}: {message}")]
pub struct PlotError {
    /// The chart's title.
    pub title: String,
    /// What plotters said.
    pub message: String,
}

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// In the legend.
    pub label: String,
    /// (x, y), in order of x.
    pub points: Vec<(f64, f64)>,
    /// Index into the palette.
    pub color: usize,
    /// Dashed (a secondary measure of the same run).
    pub dashed: bool,
}

/// Where the legend goes (where the lines leave room).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegendAt {
    /// Lower right (CDFs rise to the right).
    LowerRight,
    /// Upper right.
    UpperRight,
}

/// A line chart, ready to draw.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// Caption.
    pub title: String,
    /// X axis description.
    pub x_desc: String,
    /// Y axis description.
    pub y_desc: String,
    /// Logarithmic x axis.
    pub log_x: bool,
    /// X range.
    pub x: Range<f64>,
    /// Y range.
    pub y: Range<f64>,
    /// The lines.
    pub curves: Vec<Curve>,
    /// The legend's corner.
    pub legend_at: LegendAt,
}

/// A tick label: up to 3 significant digits, no trailing zeros.
pub fn tick(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return "0".to_owned();
    }
    let decimals = (2.0 - v.abs().log10().floor()).clamp(0.0, 6.0) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// The leading digit of `v` (`v / 10^floor(log10 v)`, rounded to hide float noise).
fn mantissa(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 0.0;
    }
    (v / 10f64.powf(v.log10().floor()) * 1000.0).round() / 1000.0
}

/// The range of the x values of `curves`, widened when it is a single point.
fn x_span(curves: &[Curve]) -> Option<Range<f64>> {
    let xs = curves.iter().flat_map(|c| c.points.iter().map(|p| p.0));
    let (lo, hi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)));
    if lo > hi {
        return None;
    }
    Some(if hi > lo { lo..hi } else { lo * 0.9..hi * 1.1 + 0.001 })
}

fn y_top(curves: &[Curve]) -> f64 {
    let top = curves.iter().flat_map(|c| c.points.iter().map(|p| p.1)).fold(0.0, f64::max);
    if top > 0.0 {
        top * 1.1
    } else {
        1.0
    }
}

/// The latency CDF: for one run its TTFT and whole-request lines, for
/// several the whole request of each. `None` without any value.
pub fn latency_cdf(runs: &[(&str, &Histogram<u64>, &Histogram<u64>)]) -> Option<Chart> {
    let mut curves = Vec::new();
    if let [(_, ttft, total)] = runs {
        for (i, (name, h)) in [("total", total), ("ttft", ttft)].into_iter().enumerate() {
            if !h.is_empty() {
                curves.push(Curve { label: name.to_owned(), points: dist::cdf(h), color: i, dashed: false });
            }
        }
    } else {
        for (i, (label, _, total)) in runs.iter().enumerate() {
            if !total.is_empty() {
                curves.push(Curve { label: (*label).to_owned(), points: dist::cdf(total), color: i, dashed: false });
            }
        }
    }
    let x = x_span(&curves)?;
    let what = if runs.len() == 1 { "latency" } else { "whole-request latency" };
    Some(Chart {
        title: "Latency CDF".to_owned(),
        x_desc: format!("{what} (ms)"),
        y_desc: "% of requests at or below".to_owned(),
        log_x: x.end / x.start >= dist::LOG_RATIO,
        x,
        y: 0.0..100.0,
        curves,
        legend_at: LegendAt::LowerRight,
    })
}

/// A histogram of one measure, every run's on shared bins (as steps, in %
/// of that run's values, so that runs of different sizes compare). `None`
/// without any value.
pub fn histogram(title: &str, x_desc: &str, runs: &[(&str, &Histogram<u64>)]) -> Option<Chart> {
    let bins = Bins::covering(runs.iter().map(|r| r.1))?;
    let edges: Vec<f64> = bins.edges().into_iter().map(|us| us / 1000.0).collect();
    let mut curves = Vec::new();
    for (i, (label, h)) in runs.iter().enumerate() {
        if h.is_empty() {
            continue;
        }
        let mut points = Vec::with_capacity(2 * bins.n + 2);
        points.push((edges[0], 0.0));
        for (j, share) in bins.shares(h).into_iter().enumerate() {
            points.push((edges[j], share));
            points.push((edges[j + 1], share));
        }
        points.push((edges[bins.n], 0.0));
        curves.push(Curve { label: (*label).to_owned(), points, color: i, dashed: false });
    }
    let y = 0.0..y_top(&curves);
    Some(Chart {
        title: title.to_owned(),
        x_desc: x_desc.to_owned(),
        y_desc: "% of values".to_owned(),
        log_x: bins.log,
        x: edges[0]..edges[bins.n],
        y,
        curves,
        legend_at: LegendAt::UpperRight,
    })
}

/// Completed requests per second over the run (and failed ones, dashed,
/// when there were any). Each run: (label, timeline, its length in seconds,
/// the rounds summed in the timeline, whose mean is drawn). `None` without
/// any bucket.
pub fn throughput(runs: &[(&str, &Timeline, f64, usize)]) -> Option<Chart> {
    let mut curves = Vec::new();
    for (i, (label, timeline, elapsed, rounds)) in runs.iter().enumerate() {
        let rates = timeline.rates(*elapsed);
        if rates.is_empty() {
            continue;
        }
        let per = 1.0 / (*rounds).max(1) as f64;
        let name = |what: &str| if runs.len() == 1 { what.to_owned() } else { format!("{label} {what}") };
        curves.push(Curve {
            label: name("completed/s"),
            points: rates.iter().map(|r| (r.at_sec, r.completed * per)).collect(),
            color: i,
            dashed: false,
        });
        if rates.iter().any(|r| r.errors > 0.0) {
            curves.push(Curve {
                label: name("errors/s"),
                points: rates.iter().map(|r| (r.at_sec, r.errors * per)).collect(),
                color: i,
                dashed: true,
            });
        }
    }
    let end = runs.iter().map(|r| r.2).fold(0.0, f64::max);
    if curves.is_empty() {
        return None;
    }
    let y = 0.0..y_top(&curves);
    Some(Chart {
        title: "Throughput over time".to_owned(),
        x_desc: "seconds since the start".to_owned(),
        y_desc: "requests per second".to_owned(),
        log_x: false,
        x: 0.0..end.max(0.001),
        y,
        curves,
        legend_at: LegendAt::LowerRight,
    })
}

impl Chart {
    /// The chart as one `<svg>` element.
    pub fn svg(&self) -> Result<String, PlotError> {
        let mut out = String::new();
        let drawn = if self.log_x {
            // From a power of ten: plotters labels a log axis from the first
            // one in range, and none below it.
            let from = 10f64.powf(self.x.start.log10().floor());
            let from = if from.is_finite() && from > 0.0 { from } else { self.x.start };
            self.draw(&mut out, (from..self.x.end).log_scale())
        } else {
            self.draw(&mut out, self.x.clone())
        };
        drawn.map_err(|message| PlotError { title: self.title.clone(), message })?;
        Ok(out)
    }

    fn draw<X>(&self, out: &mut String, x: X) -> Result<(), String>
    where
        X: AsRangedCoord<Value = f64>,
        X::CoordDescType: ValueFormatter<f64>,
    {
        let e = |e: &dyn std::fmt::Display| e.to_string();
        let root = SVGBackend::with_string(out, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|x| e(&x))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&self.title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(x, self.y.clone())
            .map_err(|x| e(&x))?;
        let log = self.log_x;
        // A log axis has a tick at every 1-9 × 10^k: labels on 1, 2 and 5
        // only, or they run into each other near each power of ten.
        let x_label =
            move |v: &f64| if !log || [1.0, 2.0, 5.0].contains(&mantissa(*v)) { tick(*v) } else { String::new() };
        let mut mesh = chart.configure_mesh();
        mesh.x_desc(&self.x_desc)
            .y_desc(&self.y_desc)
            .x_label_formatter(&x_label)
            .y_label_formatter(&|v| tick(*v))
            .light_line_style(BLACK.mix(0.05))
            .bold_line_style(BLACK.mix(0.15))
            .label_style(("sans-serif", 15));
        if log {
            // The ticks are grid enough; light lines between them would crowd into a band.
            mesh.x_max_light_lines(0);
        }
        mesh.draw().map_err(|x| e(&x))?;
        for c in &self.curves {
            let (r, g, b) = PALETTE[c.color % PALETTE.len()];
            let color = RGBColor(r, g, b);
            let style = color.stroke_width(2);
            let drawn = if c.dashed {
                chart.draw_series(DashedLineSeries::new(c.points.iter().copied(), 6, 4, style))
            } else {
                chart.draw_series(LineSeries::new(c.points.iter().copied(), style))
            };
            drawn
                .map_err(|x| e(&x))?
                .label(&c.label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        }
        if self.curves.len() < 2 {
            // One line needs no key: the axes say what it is.
            root.present().map_err(|x| e(&x))?;
            return Ok(());
        }
        let position = match self.legend_at {
            LegendAt::LowerRight => SeriesLabelPosition::LowerRight,
            LegendAt::UpperRight => SeriesLabelPosition::UpperRight,
        };
        chart
            .configure_series_labels()
            .position(position)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 15))
            .draw()
            .map_err(|x| e(&x))?;
        root.present().map_err(|x| e(&x))?;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::load::dist::tests::hist;

    #[test]
    fn ticks_read_well() {
        let cases = [(0.0, "0"), (0.001, "0.001"), (0.0125, "0.0125"), (1.5, "1.5"), (12.0, "12"), (120.0, "120")];
        for (v, want) in cases {
            assert_eq!(tick(v), want, "{v}");
        }
        assert_eq!(tick(12345.6), "12346");
        assert_eq!(tick(f64::NAN), "0");
        assert_eq!([0.002, 0.05, 1.0, 30.0, 700.0, 90.0].map(mantissa), [2.0, 5.0, 1.0, 3.0, 7.0, 9.0]);
    }

    #[test]
    fn charts_draw_as_svg_text() {
        let (ttft, total) = (hist((1..=200).map(|i| i * 100)), hist((1..=200).map(|i| i * 300)));
        let empty = hist([]);
        let one = latency_cdf(&[("run", &ttft, &total)]).unwrap();
        assert_eq!(one.curves.iter().map(|c| c.label.as_str()).collect::<Vec<_>>(), ["total", "ttft"]);
        assert!(one.log_x, "0.1 to 60 ms");
        let svg = one.svg().unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
        assert!(svg.contains("\nLatency CDF\n</text>") && svg.contains("<polyline"), "{svg}");
        assert!(svg.contains("\nttft\n</text>"), "legend: {svg}");
        // Several runs: one line each, the runs without values left out.
        let two = latency_cdf(&[("a", &empty, &total), ("b", &empty, &empty), ("c<&>", &empty, &ttft)]).unwrap();
        assert_eq!(two.curves.iter().map(|c| c.color).collect::<Vec<_>>(), [0, 2]);
        assert!(two.svg().unwrap().contains("c&lt;&amp;&gt;"), "labels are escaped");
        assert!(latency_cdf(&[("a", &empty, &empty)]).is_none());

        let h = histogram("TTFT histogram", "TTFT (ms)", &[("a", &ttft), ("b", &total)]).unwrap();
        assert_eq!(h.curves.len(), 2);
        assert_eq!(h.curves[0].points.len(), 2 * dist::BINS + 2);
        let svg = h.svg().unwrap();
        assert!(svg.contains("\nTTFT histogram\n</text>"), "{svg}");
        assert!(histogram("x", "x", &[("a", &empty)]).is_none());

        let mut t = Timeline::new();
        t.ok(Duration::from_millis(500), 1);
        t.ok(Duration::from_millis(1500), 1);
        let chart = throughput(&[("a", &t, 2.0, 1)]).unwrap();
        assert_eq!(chart.curves.len(), 1, "no errors, no errors line");
        assert_eq!(chart.curves[0].points, [(0.5, 1.0), (1.5, 1.0)]);
        // Two rounds summed: their mean.
        assert_eq!(throughput(&[("a", &t, 2.0, 2)]).unwrap().curves[0].points, [(0.5, 0.5), (1.5, 0.5)]);
        t.error(Duration::from_millis(1600));
        let chart = throughput(&[("a", &t, 2.0, 1), ("b", &Timeline::new(), 2.0, 1)]).unwrap();
        assert_eq!(
            chart.curves.iter().map(|c| (c.label.as_str(), c.dashed)).collect::<Vec<_>>(),
            [("a completed/s", false), ("a errors/s", true)]
        );
        assert!(chart.svg().unwrap().contains("\nThroughput over time\n</text>"));
        assert!(throughput(&[("a", &Timeline::new(), 1.0, 1)]).is_none());
    }
}
