//! The handoff-latency plot, as hand-written SVG (log–log axes).

use std::fmt::Write as _;

#[derive(Debug)]
pub struct Series {
    pub label: String,
    pub color: &'static str,
    pub dashed: bool,
    /// (waiters, latency in µs)
    pub points: Vec<(f64, f64)>,
}

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;

pub fn handoff_plot(title: &str, series: &[Series]) -> String {
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    let ys: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|y| *y > 0.0)
        .collect();
    let (x_min, x_max) = bounds(&xs, 2.0);
    let (y_min, y_max) = bounds(&ys, 10.0);
    // Decades on y, powers of two on x.
    let y_lo = 10f64.powf(y_min.log10().floor());
    let y_hi = 10f64.powf(y_max.log10().ceil());
    let x_lo = 2f64.powf(x_min.log2().floor());
    let x_hi = 2f64.powf(x_max.log2().ceil());
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x_at = |x: f64| LEFT + (x.log2() - x_lo.log2()) / (x_hi.log2() - x_lo.log2()) * plot_w;
    let y_at =
        |y: f64| TOP + plot_h - (y.log10() - y_lo.log10()) / (y_hi.log10() - y_lo.log10()) * plot_h;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        LEFT + plot_w / 2.0,
        escape(title)
    );
    // Grid and ticks.
    let mut y = y_lo;
    while y <= y_hi * 1.0001 {
        let py = y_at(y);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            py + 4.0,
            duration_label(y)
        );
        y *= 10.0;
    }
    let mut x = x_lo;
    while x <= x_hi * 1.0001 {
        let px = x_at(x);
        let _ = writeln!(
            svg,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#eee"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{x}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 18.0
        );
        x *= 2.0;
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#444"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">waiters (tasks queued behind the holder)</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 18.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">handoff latency (release call → next waiter's acquire)</text>"#,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0
    );
    // Series and legend.
    for (index, s) in series.iter().enumerate() {
        let dash = if s.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let points: Vec<String> = s
            .points
            .iter()
            .filter(|p| p.1 > 0.0)
            .map(|&(x, y)| format!("{:.1},{:.1}", x_at(x), y_at(y)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
            points.join(" "),
            s.color
        );
        for p in s.points.iter().filter(|p| p.1 > 0.0) {
            let _ = writeln!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"/>"#,
                x_at(p.0),
                y_at(p.1),
                s.color
            );
        }
        let ly = TOP + 10.0 + index as f64 * 20.0;
        let lx = LEFT + plot_w + 14.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
            lx + 28.0,
            s.color,
            lx + 34.0,
            ly + 4.0,
            escape(&s.label)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn bounds(values: &[f64], fallback: f64) -> (f64, f64) {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(0.0, f64::max);
    if lo.is_finite() && hi > 0.0 {
        (lo, hi)
    } else {
        (fallback, fallback * 10.0)
    }
}

fn duration_label(micros: f64) -> String {
    if micros >= 1e6 {
        format!("{} s", micros / 1e6)
    } else if micros >= 1e3 {
        format!("{} ms", micros / 1e3)
    } else {
        format!("{micros} µs")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
