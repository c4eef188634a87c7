//! SVG line charts for the experiments (plotters): named series of points, a title and axis
//! labels, optional markers, a legend.

use std::path::Path;

use plotters::prelude::*;

use crate::lab::LabError;

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points in x order.
    pub points: Vec<(f64, f64)>,
    /// Draw a dot at each point (for sparse data such as one value per channel count).
    pub markers: bool,
    /// Draw dashed-looking thin line (for reference curves from the research).
    pub reference: bool,
}

impl Series {
    /// A measured series.
    pub fn measured(name: impl Into<String>, points: Vec<(f64, f64)>, markers: bool) -> Series {
        Series {
            name: name.into(),
            points,
            markers,
            reference: false,
        }
    }

    /// A reference series (expected values), drawn thin in grey tones.
    pub fn reference(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            points,
            markers: true,
            reference: true,
        }
    }
}

/// Axis titles and ranges of a chart.
#[derive(Debug, Clone)]
pub struct Axes<'a> {
    /// Chart title.
    pub title: &'a str,
    /// X axis label.
    pub x: &'a str,
    /// Y axis label.
    pub y: &'a str,
    /// Y range; from the data when `None`.
    pub y_range: Option<(f64, f64)>,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if hi - lo < 1e-9 {
        return (lo - 0.5, hi + 0.5);
    }
    (lo, hi)
}

/// Draws `series` into an SVG file at `path`.
pub fn line_chart(path: &Path, axes: &Axes, series: &[Series]) -> Result<(), LabError> {
    let fail = |e: String| LabError::Io {
        context: format!("drawing {}", path.display()),
        source: std::io::Error::other(e),
    };
    let all = || series.iter().flat_map(|s| s.points.iter());
    let (x0, x1) = range(all().map(|p| p.0));
    let (y0, y1) = axes.y_range.unwrap_or_else(|| {
        let (lo, hi) = range(all().map(|p| p.1));
        (lo.min(0.0), hi * 1.05)
    });
    let root = SVGBackend::new(path, (960, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(axes.title, ("sans-serif", 20))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| fail(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc(axes.x)
        .y_desc(axes.y)
        .draw()
        .map_err(|e| fail(e.to_string()))?;
    let mut measured = 0;
    let mut references = 0;
    for s in series {
        let color = if s.reference {
            references += 1;
            RGBColor(90 + 40 * (references % 3) as u8, 90, 90)
        } else {
            measured += 1;
            COLORS[(measured - 1) % COLORS.len()]
        };
        let width = if s.reference { 1 } else { 2 };
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(width),
            ))
            .map_err(|e| fail(e.to_string()))?
            .label(s.name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        if s.markers {
            chart
                .draw_series(
                    s.points
                        .iter()
                        .map(|&p| Circle::new(p, if s.reference { 2 } else { 4 }, color.filled())),
                )
                .map_err(|e| fail(e.to_string()))?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| fail(e.to_string()))?;
    root.present().map_err(|e| fail(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg_with_the_title_and_every_legend_entry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.svg");
        let series = vec![
            Series::measured("reno, 64 packets", vec![(1.0, 0.4), (2.0, 0.6)], true),
            Series::reference("Expr. 5.3", vec![(1.0, 0.75), (2.0, 0.875)]),
        ];
        let axes = Axes {
            title: "Utilization vs channels",
            x: "channels",
            y: "utilization",
            y_range: Some((0.0, 1.0)),
        };
        line_chart(&path, &axes, &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        for text in ["Utilization vs channels", "reno, 64 packets", "Expr. 5.3"] {
            assert!(svg.contains(text), "{text} missing");
        }
    }
}
