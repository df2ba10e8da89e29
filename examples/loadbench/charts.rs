//! SVG charts of the closed-loop scenarios, written next to their results
//! (`bench/results/<scenario>-latency.svg` and `-throughput.svg`; smoke runs
//! next to the binary, like their JSON).
//!
//! Two pictures per scenario: the latency CDF of every client (x: latency in
//! ms on a log scale, y: share of requests answered within it, read off the
//! client's HDR histogram over all its rounds), and the median throughput of
//! every client as a bar, with the baseline's throughput as a vertical line
//! so that each ratio can be read at a glance. Drawn with `plotters`' SVG
//! backend (text as SVG `<text>`, no font files needed).
//!
//! The `overload` scenario draws one more ([`goodput`]): goodput against
//! offered load, one line per contender, with the backends' capacity and
//! the ideal (all offered work done, up to capacity) for reference.

use std::path::{Path, PathBuf};

use hdrhistogram::Histogram;
use plotters::prelude::*;

/// One client of a scenario, as the charts see it.
pub struct Series<'a> {
    pub name: &'a str,
    /// Median requests per second over the rounds.
    pub rate: f64,
    /// Every latency of every round, µs.
    pub hist: &'a Histogram<u64>,
}

/// Writes both charts of `scenario` into `out`; returns their paths.
/// `baseline` indexes the client whose throughput is the reference line.
pub fn write(
    out: &Path,
    scenario: &str,
    series: &[Series<'_>],
    baseline: usize,
) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let cdf = out.join(format!("{scenario}-latency.svg"));
    let bars = out.join(format!("{scenario}-throughput.svg"));
    latency_cdf(&cdf, scenario, series).map_err(|e| format!("{}: {e}", cdf.display()))?;
    throughput_bars(&bars, scenario, series, baseline)
        .map_err(|e| format!("{}: {e}", bars.display()))?;
    Ok(vec![cdf, bars])
}

type Res = Result<(), Box<dyn std::error::Error>>;

/// Points (latency ms, % of requests at or below it) of one histogram.
fn cdf_points(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    let mut qs: Vec<f64> = (0..=100).map(|i| i as f64 / 100.0).collect();
    qs.extend([0.995, 0.999, 0.9995, 0.9999, 1.0]);
    qs.sort_by(f64::total_cmp);
    qs.iter()
        .map(|&q| (h.value_at_quantile(q).max(1) as f64 / 1000.0, q * 100.0))
        .collect()
}

fn latency_cdf(path: &Path, scenario: &str, series: &[Series<'_>]) -> Res {
    let shown: Vec<&Series<'_>> = series.iter().filter(|s| !s.hist.is_empty()).collect();
    let lo = shown
        .iter()
        .map(|s| s.hist.min().max(1) as f64 / 1000.0)
        .fold(f64::INFINITY, f64::min);
    let hi = shown
        .iter()
        .map(|s| s.hist.max().max(1) as f64 / 1000.0)
        .fold(0.0, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (lo * 0.8, hi * 1.25)
    } else {
        (0.01, 10.0)
    };
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{scenario}: latency CDF per client (all rounds)"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..100f64)?;
    chart
        .configure_mesh()
        .x_desc("latency (ms, log scale)")
        .y_desc("% of requests at or below")
        .x_label_formatter(&|v| format!("{v:.2}"))
        .draw()?;
    for (i, s) in shown.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(cdf_points(s.hist), color.stroke_width(2)))?
            .label(s.name.to_string())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn throughput_bars(path: &Path, scenario: &str, series: &[Series<'_>], baseline: usize) -> Res {
    let n = series.len().max(1) as f64;
    let top = series.iter().map(|s| s.rate).fold(1.0, f64::max) * 1.1;
    let base = series.get(baseline).map_or(0.0, |s| s.rate);
    let height = 120 + 44 * series.len() as u32;
    let root = SVGBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{scenario}: requests per second (median over rounds)"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(8)
        .build_cartesian_2d(0f64..top, 0f64..n)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("requests per second")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        // First client on top.
        let y = n - 1.0 - i as f64;
        let color = Palette99::pick(i).to_rgba();
        chart.draw_series(std::iter::once(Rectangle::new(
            [(0.0, y + 0.18), (s.rate, y + 0.82)],
            color.mix(0.4).filled(),
        )))?;
        let ratio = if base > 0.0 && i != baseline {
            format!(" ({:.2} x baseline)", s.rate / base)
        } else if i == baseline {
            " (baseline)".to_string()
        } else {
            String::new()
        };
        chart.draw_series(std::iter::once(Text::new(
            format!("{}: {:.0}/s{ratio}", s.name, s.rate),
            (top * 0.01, y + 0.62),
            ("sans-serif", 14),
        )))?;
    }
    if base > 0.0 {
        chart
            .draw_series(LineSeries::new(
                vec![(base, 0.0), (base, n)],
                BLACK.stroke_width(1),
            ))?
            .label("baseline")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// One contender's goodput curve: (offered load as a multiple of capacity,
/// goodput in tasks per second).
pub struct Curve<'a> {
    pub name: &'a str,
    pub points: Vec<(f64, f64)>,
}

/// Writes the goodput-against-offered-load chart of `scenario` to `path`.
pub fn goodput(
    path: &Path,
    scenario: &str,
    curves: &[Curve<'_>],
    capacity: f64,
) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    goodput_lines(path, scenario, curves, capacity).map_err(|e| format!("{}: {e}", path.display()))
}

fn goodput_lines(path: &Path, scenario: &str, curves: &[Curve<'_>], capacity: f64) -> Res {
    let x_max = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|p| p.0))
        .fold(1.0, f64::max)
        * 1.05;
    let y_max = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|p| p.1))
        .fold(capacity, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{scenario}: goodput against offered load"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("offered load (x backends' capacity)")
        .y_desc("goodput (successes within the SLO per second)")
        .x_label_formatter(&|v| format!("{v:.1}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    let grey = BLACK.mix(0.5);
    chart
        .draw_series(LineSeries::new(
            vec![(0.0, 0.0), (1.0, capacity), (x_max, capacity)],
            grey.stroke_width(1),
        ))?
        .label(format!("ideal (capacity {capacity:.0}/s)"))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], grey));
    for (i, c) in curves.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(c.points.clone(), color.stroke_width(2)))?
            .label(c.name.to_string())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(c.points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::MiddleRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
