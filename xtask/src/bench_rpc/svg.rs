//! The plot: tokens/s per arm per group count, a bar per median with a
//! min–max whisker over the repeats.
//!
//! Written by hand as SVG rather than through transfer-bench's plotters:
//! calling transfer-bench would add a release build of a second binary
//! (minutes on the 2 shared cores) to every first run of this bench, for a
//! chart of a handful of bars; SVG needs no font package either.

use std::fmt::Write as _;

use super::args::Arm;
use super::report::Cell;

fn colour(arm: Arm) -> &'static str {
    match arm {
        Arm::Hub => "#9e9e9e",
        Arm::Direct => "#1f77b4",
        Arm::Engine => "#d62728",
    }
}

/// A "nice" axis maximum at or above `v` (1, 2 or 5 times a power of ten).
pub fn nice_max(v: f64) -> f64 {
    if !(v.is_finite() && v > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|m| *m >= v)
        .unwrap_or(10.0 * p)
}

/// The chart of `cells` (arms in the order given, groups along x).
pub fn chart(cells: &[Cell], arms: &[Arm], groups: &[usize], title: &str) -> String {
    let (w, h) = (720.0, 420.0);
    let (left, right, top, bottom) = (70.0, 150.0, 50.0, 60.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let top_value = cells
        .iter()
        .map(|c| c.tps_max.max(c.tps_median))
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let ymax = nice_max(top_value);
    let y = |v: f64| top + ph - (v / ymax).clamp(0.0, 1.0) * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" font-size="15" text-anchor="middle">{}</text>"#,
        left + pw / 2.0,
        escape(title)
    );
    for k in 0..=5 {
        let v = ymax * k as f64 / 5.0;
        let yy = y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#e0e0e0"/><text x="{}" y="{:.1}" text-anchor="end">{v}</text>"##,
            left + pw,
            left - 6.0,
            yy + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text transform="translate(18,{}) rotate(-90)" text-anchor="middle">output tokens/s (median, min-max)</text>"#,
        top + ph / 2.0
    );
    let slot = pw / groups.len().max(1) as f64;
    let bar = slot * 0.8 / arms.len().max(1) as f64;
    for (gi, g) in groups.iter().enumerate() {
        let x0 = left + slot * gi as f64 + slot * 0.1;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{g} group{}</text>"#,
            x0 + slot * 0.4,
            top + ph + 20.0,
            if *g == 1 { "" } else { "s" }
        );
        for (ai, arm) in arms.iter().enumerate() {
            let Some(c) = cells
                .iter()
                .find(|c| c.arm == *arm && c.groups == *g && c.runs > 0)
            else {
                continue;
            };
            let x = x0 + bar * ai as f64;
            let yy = y(c.tps_median);
            // A bar whose arm fell back measured another path: pale.
            let opacity = if c.fell_back > 0 { 0.35 } else { 1.0 };
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{yy:.1}" width="{:.1}" height="{:.1}" fill="{}" fill-opacity="{opacity}"/>"#,
                bar * 0.9,
                top + ph - yy,
                colour(*arm)
            );
            if c.fell_back > 0 {
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">fell back</text>"#,
                    x + bar * 0.45,
                    top + ph - 6.0
                );
            }
            let cx = x + bar * 0.45;
            let _ = writeln!(
                s,
                r#"<line x1="{cx:.1}" x2="{cx:.1}" y1="{:.1}" y2="{:.1}" stroke="black"/>"#,
                y(c.tps_min),
                y(c.tps_max)
            );
            let _ = writeln!(
                s,
                r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle" font-size="10">{:.1}</text>"#,
                y(c.tps_max) - 4.0,
                c.tps_median
            );
        }
    }
    let _ = writeln!(
        s,
        r#"<line x1="{left}" x2="{}" y1="{}" y2="{}" stroke="black"/>"#,
        left + pw,
        top + ph,
        top + ph
    );
    for (ai, arm) in arms.iter().enumerate() {
        let ly = top + 20.0 * ai as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{}" y="{ly}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            left + pw + 20.0,
            colour(*arm),
            left + pw + 38.0,
            ly + 10.0,
            arm.name()
        );
    }
    s.push_str("</svg>\n");
    s
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(arm: Arm, groups: usize, tps: f64) -> Cell {
        Cell {
            arm,
            groups,
            runs: 3,
            tps_median: tps,
            tps_min: tps * 0.9,
            tps_max: tps * 1.1,
            ms_p50: 1.0,
            ms_p99: 2.0,
            coordinator_bytes_per_step: 0.0,
            ratio_vs_hub: None,
            fell_back: 0,
        }
    }

    #[test]
    fn axis_maxima_are_round() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(7.3), 10.0);
        assert_eq!(nice_max(13.0), 20.0);
        assert_eq!(nice_max(41.0), 50.0);
        assert_eq!(nice_max(200.0), 200.0);
    }

    #[test]
    fn one_bar_per_cell_run_and_a_legend() {
        let mut fell = cell(Arm::Direct, 1, 20.0);
        fell.fell_back = 1;
        let cells = [cell(Arm::Hub, 1, 10.0), fell, cell(Arm::Hub, 3, 12.0)];
        let svg = chart(&cells, &[Arm::Hub, Arm::Direct], &[1, 3], "a <b>");
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        // 3 bars + 2 legend swatches + background.
        assert_eq!(svg.matches("<rect").count(), 6);
        assert!(svg.contains(">20.0<") && svg.contains(">3 groups<"));
        assert!(svg.contains("a &lt;b&gt;"));
        assert_eq!(svg.matches(">fell back<").count(), 1);
        assert_eq!(svg.matches("fill-opacity=\"0.35\"").count(), 1);
        // The tallest whisker (22) fits under the axis maximum (50).
        assert!(svg.contains(">50<"));
    }
}
