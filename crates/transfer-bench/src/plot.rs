//! Plots (SVG and PNG) of engine vs baseline.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::results::{Results, Row};

/// Where a TrueType font may be found; plotters needs one to lay out text.
const FONTS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// Registers a font once; false when none is installed.
pub(crate) fn font_ready() -> bool {
    static READY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READY.get_or_init(|| {
        for f in FONTS {
            if let Ok(bytes) = std::fs::read(f) {
                let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, leaked).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

fn series(rows: &[&Row], engine: bool) -> Series {
    let name = if engine {
        "engine".to_string()
    } else {
        rows.iter()
            .find_map(|r| r.baseline_name.clone())
            .unwrap_or_else(|| "baseline".into())
    };
    let points = rows
        .iter()
        .filter_map(|r| {
            let f = if engine {
                Some(&r.engine)
            } else {
                r.baseline.as_ref()
            };
            f.map(|f| (r.size.max(1) as f64, f.value))
        })
        .filter(|(_, y)| y.is_finite() && *y > 0.0)
        .collect();
    Series { name, points }
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    y_label: &str,
    data: &[Series],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let err = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let xs = data.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let ys = data.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let (xmin, xmax) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let ymax = ys.fold(0.0f64, f64::max);
    if xmin > xmax || ymax <= 0.0 {
        return Err("no data".into());
    }
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((xmin..xmax * 1.01).log_scale(), 0.0..ymax * 1.1)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("bytes per operation")
        .y_desc(y_label)
        .x_label_formatter(&|x| decimal_size(*x))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, s) in data.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(s.points.clone(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

/// Log-axis ticks fall on powers of ten: label them in decimal units.
fn decimal_size(x: f64) -> String {
    if x >= 1e6 {
        format!("{} MB", x / 1e6)
    } else if x >= 1e3 {
        format!("{} kB", x / 1e3)
    } else {
        format!("{x} B")
    }
}

fn one(
    dir: &Path,
    stem: &str,
    title: &str,
    y_label: &str,
    data: &[Series],
    written: &mut Vec<PathBuf>,
) -> Result<(), String> {
    let svg = dir.join(format!("{stem}.svg"));
    draw(
        SVGBackend::new(&svg, (900, 540)).into_drawing_area(),
        title,
        y_label,
        data,
    )?;
    written.push(svg);
    let png = dir.join(format!("{stem}.png"));
    draw(
        BitMapBackend::new(&png, (900, 540)).into_drawing_area(),
        title,
        y_label,
        data,
    )?;
    written.push(png);
    Ok(())
}

/// Writes the plots into `dir`; returns the files written.
pub fn write_all(res: &Results, dir: &Path) -> Result<Vec<PathBuf>, String> {
    if !font_ready() {
        return Err("no TrueType font found (install fonts-dejavu-core); plots skipped".into());
    }
    let mut written = Vec::new();
    let pick =
        |sweep: &str| -> Vec<&Row> { res.rows.iter().filter(|r| r.sweep == sweep).collect() };
    let gbps = |s: Series| Series {
        points: s.points.into_iter().map(|(x, y)| (x, y / 1e9)).collect(),
        ..s
    };
    let bw = pick("write_bw");
    if !bw.is_empty() {
        let data = [gbps(series(&bw, true)), gbps(series(&bw, false))];
        one(
            dir,
            "write_bandwidth",
            &format!("Single-write bandwidth ({})", res.provider),
            "GB/s",
            &data,
            &mut written,
        )?;
    }
    let lat = pick("write_lat");
    if !lat.is_empty() {
        let data = [series(&lat, true), series(&lat, false)];
        one(
            dir,
            "write_latency",
            &format!("Write completion latency p50 ({})", res.provider),
            "us",
            &data,
            &mut written,
        )?;
    }
    let paged: Vec<&Row> = pick("paged")
        .into_iter()
        .filter(|r| r.label.ends_with(" x 100"))
        .collect();
    if !paged.is_empty() {
        let data = [gbps(series(&paged, true)), gbps(series(&paged, false))];
        one(
            dir,
            "paged_bandwidth",
            &format!("Paged-write bandwidth, 100 pages ({})", res.provider),
            "GB/s",
            &data,
            &mut written,
        )?;
    }
    Ok(written)
}
