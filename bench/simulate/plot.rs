//! SVG figures: per algorithm, the units accepted in the trailing window over time, against
//! the limit. Drawn with plotters' SVG backend only: text is emitted as SVG `<text>` and laid
//! out by the viewer, so no font is needed at build or run time.

use std::path::Path;

use plotters::prelude::*;

use super::sim::{trailing_counts, BoxError, Run, Trace};

/// Width and height of the whole figure, px.
const SIZE: (u32, u32) = (1000, 780);
/// The trailing-window line.
const COUNT: RGBColor = RGBColor(31, 119, 180);
/// The limit line.
const LIMIT: RGBColor = RGBColor(214, 39, 40);

/// Draws one panel per run (3 rows × 2 columns) of key 0's accepted units in the trailing
/// window over `[0, span)` µs of `trace`, with the limit `L` as a dashed line, to `path`.
///
/// # Errors
///
/// When the file cannot be written.
pub(crate) fn trailing_window_svg(path: &Path, trace: &Trace, runs: &[Run], span: u64) -> Result<(), BoxError> {
    let quota = trace.quota;
    let (l, w) = (quota.limit(), quota.period_micros());
    let periods = span as f64 / w as f64;
    let steps: Vec<Vec<(f64, f64)>> =
        runs.iter().map(|r| staircase(&trailing_counts(&r.key0_accepted, w), w, span)).collect();
    let top = steps.iter().flatten().map(|&(_, c)| c).fold(2.0 * l as f64, f64::max) * 1.08;

    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let title = format!(
        "{} trace, {quota}: requests accepted in the trailing {} (blue) against the limit L = {l} (red, dashed)",
        trace.kind.name(),
        human_period(w),
    );
    let body = root.titled(&title, ("sans-serif", 18)).map_err(plot_error)?;
    for (panel, (run, points)) in body.split_evenly((3, 2)).iter().zip(runs.iter().zip(&steps)) {
        let mut chart = ChartBuilder::on(panel)
            .caption(run.algorithm.name(), ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(32)
            .y_label_area_size(52)
            .build_cartesian_2d(0.0..periods, 0.0..top)
            .map_err(plot_error)?;
        chart
            .configure_mesh()
            .x_desc("time (periods)")
            .y_desc("accepted in window")
            .x_labels(10)
            .y_labels(5)
            .x_label_formatter(&|x| tick(*x))
            .y_label_formatter(&|y| tick(*y))
            .light_line_style(WHITE)
            .draw()
            .map_err(plot_error)?;
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, l as f64), (periods, l as f64)],
                6,
                4,
                ShapeStyle::from(&LIMIT).stroke_width(2),
            ))
            .map_err(plot_error)?;
        chart
            .draw_series(LineSeries::new(points.iter().copied(), ShapeStyle::from(&COUNT).stroke_width(2)))
            .map_err(plot_error)?;
    }
    root.present().map_err(plot_error)?;
    Ok(())
}

/// The step function `(t, count)` as a polyline in periods, clipped to `[0, span)`.
fn staircase(changes: &[(u64, u64)], period: u64, span: u64) -> Vec<(f64, f64)> {
    let x = |t: u64| t as f64 / period as f64;
    let mut out = Vec::with_capacity(changes.len() * 2 + 1);
    let mut last = 0;
    for &(t, count) in changes.iter().take_while(|&&(t, _)| t < span) {
        out.push((x(t), last as f64));
        out.push((x(t), count as f64));
        last = count;
    }
    out.push((x(span), last as f64));
    out
}

/// A tick label: `2`, `2.5`.
fn tick(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// `60 s`, `1 min` style text for a period in µs.
fn human_period(us: u64) -> String {
    match us {
        60_000_000 => "minute".to_owned(),
        3_600_000_000 => "hour".to_owned(),
        86_400_000_000 => "day".to_owned(),
        _ if us.is_multiple_of(1_000_000) => format!("{} s", us / 1_000_000),
        _ if us.is_multiple_of(1_000) => format!("{} ms", us / 1_000),
        _ => format!("{us} µs"),
    }
}

/// plotters' errors borrow the backend's error type; keep their text.
fn plot_error<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> BoxError {
    format!("drawing the figure: {e}").into()
}
