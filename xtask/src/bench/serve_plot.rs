//! The plot of `bench serve`: aggregate tokens/s against concurrent
//! clients, one panel per prompt set, one line per configuration (SVG).

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

/// One configuration's line in one panel: `(clients, tokens/s)` points.
pub(super) struct Line<'a> {
    pub label: &'a str,
    pub points: Vec<(f64, f64)>,
}

/// One panel: a prompt set's lines.
pub(super) struct Panel<'a> {
    pub title: &'a str,
    pub lines: Vec<Line<'a>>,
}

const COLORS: [RGBColor; 4] = [
    RGBColor(90, 90, 90),
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
];

/// Draws `panels` side by side into the SVG file `path`, under `caption`.
pub(super) fn draw(path: &Path, caption: &str, panels: &[Panel<'_>]) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let width = 420 * panels.len().max(1) as u32;
    let root = SVGBackend::new(path, (width, 420)).into_drawing_area();
    let err = |e: DrawingAreaErrorKind<std::io::Error>| anyhow!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(caption, ("sans-serif", 16)).map_err(err)?;
    let x_max = panels
        .iter()
        .flat_map(|p| p.lines.iter().flat_map(|l| l.points.iter().map(|p| p.0)))
        .fold(1.0, f64::max);
    let y_max = panels
        .iter()
        .flat_map(|p| p.lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)))
        .fold(1.0, f64::max)
        * 1.15;
    for (area, panel) in root
        .split_evenly((1, panels.len().max(1)))
        .iter()
        .zip(panels)
    {
        let mut chart = ChartBuilder::on(area)
            .caption(panel.title, ("sans-serif", 15))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(48)
            .build_cartesian_2d(0.0..x_max + 1.0, 0.0..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("concurrent clients")
            .y_desc("tokens/s (all clients)")
            .draw()
            .map_err(err)?;
        for (line, color) in panel.lines.iter().zip(COLORS.iter().cycle()) {
            let color = *color;
            chart
                .draw_series(LineSeries::new(
                    line.points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(err)?
                .label(line.label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
            chart
                .draw_series(
                    line.points
                        .iter()
                        .map(|&p| Circle::new(p, 3, color.filled())),
                )
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}
