//! `timeoutd bench --plot FILE.svg`: the run drawn, from the database's own close times.
//!
//! Top: closes per 100 ms against time from the (first) deadline, the deadline marked at 0 —
//! how fast the burst drained and whether anything closed early. Bottom: the lateness
//! distribution (`closed_at_ms − deadline_ms`) as the share of orders closed within each
//! lateness, with p50 and p99 marked. Drawn with plotters' SVG backend.

use std::path::Path;

use anyhow::Context as _;
use plotters::prelude::*;

use super::report::Closes;

/// Width of one bar of the top chart, ms.
const BUCKET_MS: i64 = 100;

/// Draws the daemon's closes of this run into `file`.
///
/// # Errors
/// There is nothing to draw, or the file cannot be written.
pub(super) fn draw(closes: &Closes, file: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(!closes.since_ms.is_empty(), "no closed orders to draw");
    render(&closes.since_ms, &closes.lateness_ms, file).map_err(|e| anyhow::anyhow!("{e}"))?;
    std::fs::metadata(file).context("the plot was not written")?;
    Ok(())
}

/// `since`: each close's time from the first deadline, ms; `lateness`: sorted, ms.
fn render(since: &[i64], lateness: &[i64], file: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(file, (1000, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(400);

    // Closes per 100 ms.
    let first = since.iter().copied().min().unwrap_or(0).min(0) / BUCKET_MS;
    let last = since.iter().copied().max().unwrap_or(0) / BUCKET_MS;
    let mut counts = vec![0u32; (last - first + 1) as usize];
    for s in since {
        counts[(s / BUCKET_MS - first) as usize] += 1;
    }
    let peak = counts.iter().copied().max().unwrap_or(1);
    let to_s = |bucket: i64| (bucket * BUCKET_MS) as f64 / 1000.0;
    let (x0, x1) = (to_s(first) - 0.1, to_s(last + 1) + 0.1);
    let mut chart = ChartBuilder::on(&top)
        .caption(
            format!("closes per {BUCKET_MS} ms ({} orders)", since.len()),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(x0..x1, 0u32..peak + peak / 10 + 1)?;
    chart
        .configure_mesh()
        .x_desc("seconds after the deadline")
        .y_desc("closes")
        .draw()?;
    chart.draw_series(counts.iter().enumerate().map(|(i, n)| {
        let start = to_s(first + i as i64);
        Rectangle::new(
            [(start, 0), (start + BUCKET_MS as f64 / 1000.0, *n)],
            BLUE.mix(0.6).filled(),
        )
    }))?;
    chart
        .draw_series(LineSeries::new(
            [(0.0, 0), (0.0, peak + peak / 10 + 1)],
            RED.stroke_width(2),
        ))?
        .label("deadline")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], RED));
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;

    // The lateness distribution: share of orders closed within x ms.
    let n = lateness.len() as f64;
    let max = lateness.last().copied().unwrap_or(0).max(1);
    let min = lateness.first().copied().unwrap_or(0).min(0);
    let p50 = crate::lateness::nearest_rank(lateness, 0.50);
    let p99 = crate::lateness::nearest_rank(lateness, 0.99);
    let mut chart = ChartBuilder::on(&bottom)
        .caption(
            format!(
                "lateness (closed_at_ms − deadline_ms): p50 {p50} ms · p99 {p99} ms · max {max} ms"
            ),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(min..max + max / 20 + 1, 0f64..100f64)?;
    chart
        .configure_mesh()
        .x_desc("lateness, ms")
        .y_desc("% of orders closed")
        .draw()?;
    chart.draw_series(LineSeries::new(
        lateness
            .iter()
            .enumerate()
            .map(|(i, l)| (*l, (i + 1) as f64 * 100.0 / n)),
        BLUE.stroke_width(2),
    ))?;
    for (at, color) in [(p50, GREEN), (p99, MAGENTA)] {
        chart.draw_series(LineSeries::new([(at, 0.0), (at, 100.0)], color))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_drawn_as_an_svg_with_both_charts() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("burst.svg");
        let since: Vec<i64> = (0..500).map(|i| 3 + i * 2).collect();
        let lateness = since.clone();
        render(&since, &lateness, &file).unwrap();
        let svg = std::fs::read_to_string(&file).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.contains("closes per 100 ms (500 orders)"));
        assert!(svg.contains("p99 991 ms"), "nearest rank: the 495th of 500");
        // One bar per 100 ms bucket of the drain (0 … 1 s).
        assert!(svg.matches("<rect").count() >= 10);
    }
}
