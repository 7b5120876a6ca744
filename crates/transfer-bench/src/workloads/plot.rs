//! One SVG (and a PNG of it) per workload: time against size (log-log), one line per engine
//! (and transport, and variant: kv's compute time, moe's phase).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::workloads::records::Record;

/// (x, y label, x label) of a workload's plot: the time metric(s) and the size.
fn axes(workload: &str) -> Option<(&'static [&'static str], &'static str, &'static str)> {
    match workload {
        "kv" => Some((
            &["ttll_us"],
            "time to last layer (us)",
            "bytes per iteration (R*L*P*B)",
        )),
        "weights" => Some((&["update_s"], "seconds per update", "parameter bytes S")),
        "moe" => Some((&["dispatch_us", "combine_us"], "us", "tokens per rank T")),
        _ => None,
    }
}

fn x_of(workload: &str, p: &serde_json::Value) -> f64 {
    let g = |k: &str| p.get(k).and_then(serde_json::Value::as_f64).unwrap_or(0.0);
    match workload {
        "kv" => g("requests") * g("layers") * g("pages_per_layer") * g("page_bytes"),
        "weights" => g("total_bytes"),
        _ => g("tokens"),
    }
}

fn series_name(workload: &str, r: &Record) -> String {
    let variant = match workload {
        "kv" => format!(
            " C={}us",
            r.params
                .get("compute_us")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0)
        ),
        "moe" => format!(" {}", r.metric.trim_end_matches("_us")),
        _ => String::new(),
    };
    format!("{} {}{variant}", r.engine, r.transport)
}

/// Writes `<workload>.svg` for every workload in `records`; returns the files.
pub fn write_all(records: &[Record], dir: &Path) -> Result<Vec<PathBuf>, String> {
    if !crate::plot::font_ready() {
        return Err("no TrueType font found (install fonts-dejavu-core); plots skipped".into());
    }
    let mut files = Vec::new();
    for w in ["kv", "weights", "moe"] {
        let Some((metrics, y_label, x_label)) = axes(w) else {
            continue;
        };
        let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for r in records
            .iter()
            .filter(|r| r.workload == w && metrics.contains(&r.metric.as_str()))
        {
            let (x, y) = (x_of(w, &r.params), r.value);
            if x > 0.0 && y > 0.0 && y.is_finite() {
                series.entry(series_name(w, r)).or_default().push((x, y));
            }
        }
        if series.is_empty() {
            continue;
        }
        for pts in series.values_mut() {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        let title = format!("{w}: time vs size");
        let svg = dir.join(format!("{w}.svg"));
        draw(
            SVGBackend::new(&svg, (900, 540)).into_drawing_area(),
            &title,
            x_label,
            y_label,
            &series,
        )?;
        files.push(svg);
        // A PNG next to it, as the primitives' plots have, for viewers without SVG.
        let png = dir.join(format!("{w}.png"));
        draw(
            BitMapBackend::new(&png, (900, 540)).into_drawing_area(),
            &title,
            x_label,
            y_label,
            &series,
        )?;
        files.push(png);
    }
    Ok(files)
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &BTreeMap<String, Vec<(f64, f64)>>,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let err = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let all = series.values().flatten();
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    // A single size or value still gets a visible range.
    let (x0, x1) = (x0 / 1.5, x1 * 1.5);
    let (y0, y1) = (y0 / 1.5, y1 * 1.5);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
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
