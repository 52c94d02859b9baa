//! Charts of a bench run: decode rate vs streams per prompt kind (aggregate solid, per stream
//! dashed in the HTML, thin in the PNG) and prefill rate vs prompt length. Two renderings of the
//! same panels: a PNG ([`crate::raster`]) and a self-contained HTML file (inline SVG, no scripts,
//! no external resources).

use std::fmt::Write as _;

use super::Results;
use crate::raster::Canvas;

const W: u32 = 560;
const H: u32 = 360;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLOURS: [[u8; 3]; 4] = [
    [31, 119, 180],
    [214, 39, 40],
    [44, 160, 44],
    [148, 103, 189],
];

struct Series {
    name: String,
    colour: [u8; 3],
    thin: bool,
    points: Vec<(f64, f64)>,
}

struct Panel {
    title: String,
    x_label: &'static str,
    y_label: &'static str,
    x_ticks: Vec<(f64, String)>,
    series: Vec<Series>,
}

impl Panel {
    fn y_max(&self) -> f64 {
        let m = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0, f64::max);
        nice(m * 1.1)
    }

    fn x_range(&self) -> (f64, f64) {
        let xs = self.x_ticks.iter().map(|t| t.0);
        let lo = xs.clone().fold(f64::INFINITY, f64::min);
        let hi = xs.fold(f64::NEG_INFINITY, f64::max);
        if hi > lo {
            (lo, hi)
        } else {
            (lo - 1.0, lo + 1.0)
        }
    }

    /// Pixel position of a data point.
    fn at(&self, (x, y): (f64, f64)) -> (f64, f64) {
        let (lo, hi) = self.x_range();
        let pw = f64::from(W) - LEFT - RIGHT;
        let ph = f64::from(H) - TOP - BOTTOM;
        (
            LEFT + (x - lo) / (hi - lo) * pw,
            TOP + ph - y / self.y_max() * ph,
        )
    }
}

fn nice(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let e = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * e)
        .find(|c| *c >= v)
        .unwrap_or(10.0 * e)
}

fn panels(r: &Results) -> Vec<Panel> {
    let mut out = Vec::new();
    let mut kinds: Vec<_> = r.decode.iter().map(|d| d.kind).collect();
    kinds.dedup();
    if !r.decode.is_empty() {
        let mut streams: Vec<u32> = r.decode.iter().map(|d| d.streams).collect();
        streams.sort_unstable();
        streams.dedup();
        let mut series = Vec::new();
        for (i, k) in kinds.iter().enumerate() {
            let rows: Vec<_> = r.decode.iter().filter(|d| d.kind == *k).collect();
            let colour = COLOURS[i % COLOURS.len()];
            series.push(Series {
                name: format!("{} aggregate", k.name()),
                colour,
                thin: false,
                points: rows
                    .iter()
                    .map(|d| (f64::from(d.streams), d.aggregate.median))
                    .collect(),
            });
            series.push(Series {
                name: format!("{} per stream", k.name()),
                colour,
                thin: true,
                points: rows
                    .iter()
                    .map(|d| (f64::from(d.streams), d.per_stream.median))
                    .collect(),
            });
        }
        out.push(Panel {
            title: "decode tok/s vs streams".into(),
            x_label: "streams",
            y_label: "tok/s",
            x_ticks: streams
                .iter()
                .map(|s| (f64::from(*s), s.to_string()))
                .collect(),
            series,
        });
    }
    if !r.prefill.is_empty() {
        // log2 of the length: 8K, 16K, ... evenly spaced
        let x = |len: u64| (len as f64).log2();
        out.push(Panel {
            title: "prefill tok/s vs prompt length".into(),
            x_label: "prompt tokens",
            y_label: "tok/s",
            x_ticks: r
                .prefill
                .iter()
                .map(|p| (x(p.length), format!("{}K", p.length / 1024)))
                .collect(),
            series: vec![Series {
                name: "prefill".into(),
                colour: COLOURS[0],
                thin: false,
                points: r
                    .prefill
                    .iter()
                    .map(|p| (x(p.length), p.rate.median))
                    .collect(),
            }],
        });
    }
    out
}

fn png_panel(p: &Panel) -> Canvas {
    let mut c = Canvas::filled(W, H, [255; 3]);
    let grey = [200; 3];
    let ink = [40; 3];
    c.text(&p.title, LEFT as u32, 12, 2, ink);
    let y_max = p.y_max();
    for i in 0..=4 {
        let v = y_max * f64::from(i) / 4.0;
        let (_, y) = p.at((p.x_range().0, v));
        c.line((LEFT, y), (f64::from(W) - RIGHT, y), 1, grey);
        let label = format!("{v:.0}");
        let lw = Canvas::text_width(&label, 1);
        c.text(
            &label,
            (LEFT as u32).saturating_sub(lw + 6),
            y as u32 - 3,
            1,
            ink,
        );
    }
    for (x, label) in &p.x_ticks {
        let (px, _) = p.at((*x, 0.0));
        let lw = Canvas::text_width(label, 1);
        c.text(
            label,
            (px as u32).saturating_sub(lw / 2),
            H - BOTTOM as u32 + 8,
            1,
            ink,
        );
    }
    c.text(
        p.x_label,
        W / 2 - Canvas::text_width(p.x_label, 1) / 2,
        H - 18,
        1,
        ink,
    );
    c.text(p.y_label, 6, TOP as u32 - 14, 1, ink);
    c.line((LEFT, TOP), (LEFT, f64::from(H) - BOTTOM), 2, ink);
    c.line(
        (LEFT, f64::from(H) - BOTTOM),
        (f64::from(W) - RIGHT, f64::from(H) - BOTTOM),
        2,
        ink,
    );
    let mut ly = TOP as u32 + 4;
    for s in &p.series {
        let width = if s.thin { 1 } else { 3 };
        let pts: Vec<_> = s.points.iter().map(|pt| p.at(*pt)).collect();
        for w in pts.windows(2) {
            c.line(w[0], w[1], width, s.colour);
        }
        for pt in &pts {
            c.rect(pt.0 as u32 - 3, pt.1 as u32 - 3, 7, 7, s.colour);
        }
        c.rect(W - 170, ly, 14, width.max(2), s.colour);
        c.text(&s.name, W - 150, ly.saturating_sub(2), 1, ink);
        ly += 12;
    }
    c
}

/// The panels side by side as a PNG (empty results: a blank canvas).
#[must_use]
pub fn png(r: &Results) -> Vec<u8> {
    let ps: Vec<Canvas> = panels(r).iter().map(png_panel).collect();
    let n = ps.len().max(1) as u32;
    let mut out = Canvas::filled(W * n, H, [255; 3]);
    for (i, p) in ps.iter().enumerate() {
        for y in 0..H {
            for x in 0..W {
                let px = p.pixel(x, y);
                out.set(i as u32 * W + x, y, px);
            }
        }
    }
    out.png()
}

fn hex(c: [u8; 3]) -> String {
    format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2])
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn svg_panel(p: &Panel) -> String {
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{LEFT}\" y=\"24\" font-size=\"15\">{}</text>\n",
        esc(&p.title)
    );
    let y_max = p.y_max();
    for i in 0..=4 {
        let v = y_max * f64::from(i) / 4.0;
        let (_, y) = p.at((p.x_range().0, v));
        let _ = writeln!(
            s,
            "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#ccc\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}</text>",
            f64::from(W) - RIGHT,
            LEFT - 6.0,
            y + 4.0
        );
    }
    for (x, label) in &p.x_ticks {
        let (px, _) = p.at((*x, 0.0));
        let _ = writeln!(
            s,
            "<text x=\"{px:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            f64::from(H) - BOTTOM + 18.0,
            esc(label)
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text><text x=\"8\" y=\"{}\">{}</text>",
        W / 2,
        H - 8,
        esc(p.x_label),
        TOP - 8.0,
        esc(p.y_label)
    );
    let _ = writeln!(
        s,
        "<polyline points=\"{LEFT},{TOP} {LEFT},{b} {r},{b}\" fill=\"none\" stroke=\"#333\" stroke-width=\"2\"/>",
        b = f64::from(H) - BOTTOM,
        r = f64::from(W) - RIGHT
    );
    for (i, sr) in p.series.iter().enumerate() {
        let pts: Vec<String> = sr
            .points
            .iter()
            .map(|pt| {
                let (x, y) = p.at(*pt);
                format!("{x:.1},{y:.1}")
            })
            .collect();
        let dash = if sr.thin {
            " stroke-dasharray=\"5,4\""
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{}\"{dash}><title>{}</title></polyline>",
            pts.join(" "),
            hex(sr.colour),
            if sr.thin { 1.5 } else { 3.0 },
            esc(&sr.name)
        );
        for (pt, raw) in pts.iter().zip(&sr.points) {
            let (x, y) = pt.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(
                s,
                "<circle cx=\"{x}\" cy=\"{y}\" r=\"4\" fill=\"{}\"><title>{}: {:.1}</title></circle>",
                hex(sr.colour),
                esc(&sr.name),
                raw.1
            );
        }
        let ly = TOP + 8.0 + 16.0 * i as f64;
        let _ = writeln!(
            s,
            "<line x1=\"{}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{}\" stroke-width=\"3\"{dash}/><text x=\"{}\" y=\"{}\">{}</text>",
            W - 190,
            W - 170,
            hex(sr.colour),
            W - 164,
            ly + 4.0,
            esc(&sr.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// A self-contained HTML page: the panels as inline SVG and the table.
#[must_use]
pub fn html(r: &Results, table_markdown: &str, fingerprint: &str) -> String {
    let mut s = format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>spark-deploy bench {fp}</title>\n<style>body{{font-family:sans-serif;margin:2em}} pre{{background:#f6f6f6;padding:1em}}</style></head><body>\n<h1>spark-deploy bench</h1>\n<p>{} — {} — fingerprint {fp} — {:.0} s</p>\n",
        esc(&r.model),
        esc(&r.base_url),
        r.wall_s,
        fp = esc(fingerprint)
    );
    for p in panels(r) {
        s.push_str(&svg_panel(&p));
    }
    let _ = write!(s, "<pre>{}</pre>\n</body></html>\n", esc(table_markdown));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{DecodeRow, Kind, PrefillRow, Stat};

    #[test]
    fn both_renderings_hold_every_series() {
        let row = |kind, streams: u32, per: f64| DecodeRow {
            kind,
            streams,
            per_stream: Stat::of(vec![per]),
            aggregate: Stat::of(vec![per * f64::from(streams)]),
            ttft_s: Stat::of(vec![0.1]),
            completion_tokens: 256,
            prompt_tokens: 40,
        };
        let r = Results {
            base_url: "http://x".into(),
            model: "M".into(),
            at_unix: 0,
            wall_s: 1.0,
            decode: vec![
                row(Kind::Prose, 1, 75.0),
                row(Kind::Prose, 4, 30.0),
                row(Kind::Code, 1, 110.0),
                row(Kind::Code, 4, 44.0),
            ],
            prefill: vec![PrefillRow {
                length: 8192,
                prompt_tokens: 8200,
                rate: Stat::of(vec![2100.0]),
                ttft_s: Stat::of(vec![3.9]),
                cached_tokens: 0,
            }],
            prefill_skipped: vec![],
        };
        let h = html(&r, "| t |", "fp");
        assert_eq!(h.matches("<svg").count(), 2);
        assert!(h.contains("code aggregate") && h.contains("prefill") && h.contains("8K"));
        assert!(
            !h.contains("src=") && !h.contains("<script"),
            "self-contained"
        );
        let p = png(&r);
        assert_eq!(&p[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(u32::from_be_bytes(p[16..20].try_into().unwrap()), 2 * W);
        assert_eq!(nice(173.0), 200.0);
    }
}
