//! The benches' figures as an SVG chart: panels of horizontal bars, one
//! panel per measure, each bar a path or a program with its min-max
//! whisker, and a dashed reference line (the underlay, the reference
//! plugin) to read the bars against.
//!
//! [`svg`] is pure (a [`Chart`] in, the SVG text out) so the benches'
//! figures and the published ones in `docs/` are drawn by the same code,
//! and tests check the drawing without running a bench. Text is left to
//! the browser (plotters' SVG backend without fonts): label widths are
//! estimates, so the label column is sized from the longest label.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, anyhow};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// A chart: a title, panels stacked top to bottom, and a caption that
/// says where the figures come from (date, machine, command).
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub title: String,
    pub caption: Vec<String>,
    pub panels: Vec<Panel>,
}

/// One measure: its bars on one value axis starting at 0.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// The measure and its unit, and which way is better.
    pub title: String,
    pub bars: Vec<Bar>,
    /// Drawn as a dashed line across the bars, labelled.
    pub reference: Option<Reference>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub label: String,
    /// The median; a bar without a finite one (no figure) is left out.
    pub value: f64,
    /// The min-max over runs, drawn as a whisker when it is a range.
    pub range: Option<(f64, f64)>,
    pub kind: Kind,
}

/// What a bar is, which sets its colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// mycni's own path or program.
    Mycni,
    /// What mycni is compared with: the kernel path, the reference plugin,
    /// `ip -batch`.
    Baseline,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    pub label: String,
    pub value: f64,
}

const WIDTH: u32 = 900;
const BAR_HEIGHT: u32 = 26;
/// A panel's height besides its bars: title, value axis and its labels.
const PANEL_EXTRA: u32 = 92;
const TITLE_HEIGHT: u32 = 40;
const CAPTION_LINE: u32 = 17;
const FONT: &str = "sans-serif";
/// Pixels per character of a 13 px label, to size the label column: the
/// browser picks the font, so this errs wide.
const CHAR_WIDTH: u32 = 7;
/// The strip above a panel's bars, in bars, where the reference line is
/// labelled.
const LABEL_STRIP: f64 = 0.6;
/// Characters of a 12 px caption line that fit the width.
const CAPTION_CHARS: usize = 130;

const MYCNI: RGBColor = RGBColor(31, 119, 180);
const OTHER: RGBColor = RGBColor(150, 150, 150);
const REFERENCE_LINE: RGBColor = RGBColor(214, 39, 40);

/// The chart as SVG text.
pub fn svg(chart: &Chart) -> Result<String> {
    if chart.panels.is_empty() {
        return Err(anyhow!("chart {:?} has no panels", chart.title));
    }
    let panel_heights: Vec<u32> = chart
        .panels
        .iter()
        .map(|p| {
            let bars = p.bars.iter().filter(|b| b.value.is_finite()).count();
            PANEL_EXTRA + BAR_HEIGHT * bars.max(1) as u32
        })
        .collect();
    let caption: Vec<String> = chart
        .caption
        .iter()
        .flat_map(|l| wrap(l, CAPTION_CHARS))
        .collect();
    let caption_height = CAPTION_LINE * caption.len() as u32 + 10;
    let height = TITLE_HEIGHT + panel_heights.iter().sum::<u32>() + caption_height;
    let label_width = chart
        .panels
        .iter()
        .flat_map(|p| p.bars.iter().map(|b| b.label.chars().count()))
        // A label the chart leaves out still sizes the column: the panels
        // keep one width.
        .max()
        .unwrap_or(0) as u32
        * CHAR_WIDTH
        + 16;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let body = root
            .titled(&chart.title, (FONT, 20).into_font())
            .map_err(draw_err)?;
        let mut rest = body;
        for (panel, h) in chart.panels.iter().zip(&panel_heights) {
            let (area, below) = rest.split_vertically(*h);
            draw_panel(&area, panel, label_width)?;
            rest = below;
        }
        let small = (FONT, 12).into_font().color(&BLACK.mix(0.75));
        for (i, line) in caption.iter().enumerate() {
            rest.draw(&Text::new(
                line.clone(),
                (10, 4 + (i as u32 * CAPTION_LINE) as i32),
                small.clone(),
            ))
            .map_err(draw_err)?;
        }
        root.present().map_err(draw_err)?;
    }
    // A label plotters wrote unescaped would make a file no browser shows:
    // better the bench says so than the docs show an empty box.
    texts(&out).context("the chart drawn is not well-formed SVG")?;
    Ok(out)
}

/// The texts of the chart as drawn: what a reader sees of its labels and
/// figures (the benches' tests read them).
pub fn drawn_texts(chart: &Chart) -> Result<Vec<String>> {
    texts(&svg(chart)?)
}

/// Every `<text>` element's content, trimmed, in document order; an error
/// unless `svg` is well-formed XML with an `<svg>` root.
pub fn texts(svg: &str) -> Result<Vec<String>> {
    let doc = roxmltree::Document::parse(svg)?;
    let root = doc.root_element().tag_name().name();
    if root != "svg" {
        return Err(anyhow!("the root element is <{root}>, not <svg>"));
    }
    Ok(doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_string())
        .collect())
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel,
    label_width: u32,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let bars: Vec<&Bar> = panel.bars.iter().filter(|b| b.value.is_finite()).collect();
    let n = bars.len().max(1);
    let top = bars
        .iter()
        .flat_map(|b| [Some(b.value), b.range.map(|r| r.1)])
        .chain([panel.reference.as_ref().map(|r| r.value)])
        .flatten()
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max);
    // Room right of the longest bar for its figure.
    let x_max = if top > 0.0 { top * 1.18 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, (FONT, 15).into_font())
        .margin_left(10)
        .margin_right(24)
        .margin_bottom(6)
        .x_label_area_size(24)
        .y_label_area_size(label_width)
        // The strip above the bars holds the reference line's label.
        .build_cartesian_2d(0.0..x_max, 0.0..n as f64 + LABEL_STRIP)
        .map_err(|e| anyhow!("panel {:?}: {e}", panel.title))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_labels(8)
        .light_line_style(BLACK.mix(0.06))
        .bold_line_style(BLACK.mix(0.15))
        .x_label_formatter(&|v| tick(*v))
        .label_style((FONT, 12))
        .draw()
        .map_err(|e| anyhow!("panel {:?}: {e}", panel.title))?;
    let label_style = (FONT, 13)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Right, VPos::Center));
    let figure_style = (FONT, 12)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    for (i, bar) in bars.iter().enumerate() {
        // The first bar on top.
        let y0 = (n - 1 - i) as f64;
        let mid = y0 + 0.5;
        let (lx, ly) = chart.backend_coord(&(0.0, mid));
        area.draw(&Text::new(
            bar.label.clone(),
            (
                lx - 8 - area.get_base_pixel().0,
                ly - area.get_base_pixel().1,
            ),
            label_style.clone(),
        ))
        .map_err(|e| anyhow!("label {:?}: {e}", bar.label))?;
        let colour = match bar.kind {
            Kind::Mycni => MYCNI,
            Kind::Baseline => OTHER,
        };
        let mut rect = Rectangle::new([(0.0, y0 + 0.18), (bar.value, y0 + 0.82)], colour.filled());
        rect.set_margin(0, 0, 0, 0);
        chart
            .draw_series([rect])
            .map_err(|e| anyhow!("bar {:?}: {e}", bar.label))?;
        let mut end = bar.value;
        if let Some((lo, hi)) = bar.range.filter(|(lo, hi)| lo.is_finite() && hi > lo) {
            let whisker = BLACK.stroke_width(1);
            chart
                .draw_series([
                    PathElement::new(vec![(lo, mid), (hi, mid)], whisker),
                    PathElement::new(vec![(lo, mid - 0.15), (lo, mid + 0.15)], whisker),
                    PathElement::new(vec![(hi, mid - 0.15), (hi, mid + 0.15)], whisker),
                ])
                .map_err(|e| anyhow!("whisker {:?}: {e}", bar.label))?;
            end = end.max(hi);
        }
        chart
            .draw_series([EmptyElement::at((end, mid))
                + Text::new(short_number(bar.value), (6, 0), figure_style.clone())])
            .map_err(|e| anyhow!("figure {:?}: {e}", bar.label))?;
    }
    if let Some(r) = panel.reference.as_ref().filter(|r| r.value.is_finite()) {
        let dashed = REFERENCE_LINE.stroke_width(2);
        // Dashes by hand: plotters' dashed series needs a feature this
        // crate leaves off.
        let steps = 4 * n;
        let dashes = (0..steps).step_by(2).map(|k| {
            let a = k as f64 * n as f64 / steps as f64;
            let b = (k + 1) as f64 * n as f64 / steps as f64;
            PathElement::new(vec![(r.value, a), (r.value, b)], dashed)
        });
        chart
            .draw_series(dashes)
            .map_err(|e| anyhow!("reference {:?}: {e}", r.label))?;
        // Its label on the side of the line with room for it.
        let (side, dx) = if r.value > 0.6 * x_max {
            (HPos::Right, -5)
        } else {
            (HPos::Left, 5)
        };
        let style = (FONT, 12)
            .into_font()
            .color(&REFERENCE_LINE)
            .pos(Pos::new(side, VPos::Top));
        chart
            .draw_series([EmptyElement::at((r.value, n as f64 + LABEL_STRIP))
                + Text::new(
                    format!("{} {}", r.label, short_number(r.value)),
                    (dx, 0),
                    style,
                )])
            .map_err(|e| anyhow!("reference {:?}: {e}", r.label))?;
    }
    Ok(())
}

fn draw_err<E: std::error::Error + Send + Sync + 'static>(
    e: plotters::drawing::DrawingAreaErrorKind<E>,
) -> anyhow::Error {
    anyhow!("drawing the chart: {e}")
}

/// A figure with as many digits as a reader compares: 9.6, 13.8, 109, 0.73.
pub fn short_number(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 || a == 0.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// An axis tick: whole numbers without a fraction.
fn tick(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        short_number(v)
    }
}

/// `text` in lines of at most `width` characters, broken at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(l) if l.chars().count() + 1 + word.chars().count() <= width => {
                l.push(' ');
                l.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

/// The chart beside a report: `report.md` -> `report.svg`.
pub fn svg_path(report: &Path) -> std::path::PathBuf {
    report.with_extension("svg")
}

/// Writes the chart beside the report at `report` and says where.
pub fn write_beside(report: &Path, chart: &Chart) -> Result<()> {
    write(&svg_path(report), chart)
}

/// Writes the chart to `path` and says where.
pub fn write(path: &Path, chart: &Chart) -> Result<()> {
    let text = svg(chart)?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("bench: wrote {}", path.display());
    Ok(())
}

/// Writes `docs/benchmarks/<name>.svg`, a chart the docs show: what the
/// `published_charts` tests run by hand (`docs/benchmarks.md` says how).
pub fn write_published(name: &str, chart: &Chart) -> Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/benchmarks");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    write(&dir.join(format!("{name}.svg")), chart)
}

/// Which of `wanted` the chart, as drawn, shows no text for: the benches'
/// tests check their charts' labels and figures with it.
pub fn missing_texts<'a>(chart: &Chart, wanted: &[&'a str]) -> Result<Vec<&'a str>> {
    let texts = drawn_texts(chart)?;
    Ok(wanted
        .iter()
        .copied()
        .filter(|w| !texts.iter().any(|t| t == w))
        .collect())
}

/// The machine a bench ran on, for the chart's caption: CPUs, their
/// model, the kernel.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |p| p.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    format!("{cpus} CPUs ({model}), Linux {kernel}")
}

/// Today's date (UTC), `YYYY-MM-DD`, for the chart's caption.
pub fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    civil_date((secs / 86_400) as i64)
}

/// Days since 1970-01-01 as a proleptic Gregorian date (Howard Hinnant's
/// `civil_from_days`): no date crate for one caption line.
fn civil_date(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let mut s = String::new();
    let _ = write!(s, "{y:04}-{m:02}-{d:02}");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart() -> Chart {
        Chart {
            title: "a <bench> & its figures".into(),
            caption: vec!["measured 2026-11-26 on 2 CPUs".into()],
            panels: vec![
                Panel {
                    title: "p50 (us), lower is better".into(),
                    bars: vec![
                        Bar {
                            label: "kernel path".into(),
                            value: 13.65,
                            range: Some((13.5, 13.8)),
                            kind: Kind::Baseline,
                        },
                        Bar {
                            label: "fast path (tc encap)".into(),
                            value: 9.8,
                            range: Some((9.6, 10.0)),
                            kind: Kind::Mycni,
                        },
                        Bar {
                            label: "not measured".into(),
                            value: f64::NAN,
                            range: None,
                            kind: Kind::Mycni,
                        },
                    ],
                    reference: Some(Reference {
                        label: "underlay".into(),
                        value: 8.6,
                    }),
                },
                Panel {
                    title: "stream (Gbit/s)".into(),
                    bars: vec![Bar {
                        label: "fast path (tc encap)".into(),
                        value: 13.9,
                        range: None,
                        kind: Kind::Mycni,
                    }],
                    reference: None,
                },
            ],
        }
    }

    #[test]
    fn the_chart_is_xml_with_every_label_figure_and_the_reference() {
        let svg = match svg(&chart()) {
            Ok(s) => s,
            Err(e) => panic!("{e:#}"),
        };
        let texts = match texts(&svg) {
            Ok(t) => t,
            Err(e) => panic!("{e:#}"),
        };
        assert!(!texts.iter().any(|t| t == "not measured"), "{texts:?}");
        for want in [
            "a <bench> & its figures",
            "p50 (us), lower is better",
            "stream (Gbit/s)",
            "kernel path",
            "fast path (tc encap)",
            "9.8",
            "13.9",
            "underlay 8.6",
            "measured 2026-11-26 on 2 CPUs",
        ] {
            assert!(
                texts.iter().any(|t| t == want),
                "no text {want:?} in {texts:?}"
            );
        }
        // A bar for each figure (the first panel's third has none), each a
        // filled rect in one of the two colours.
        let bars =
            svg.matches(r##"fill="#1F77B4""##).count() + svg.matches(r##"fill="#969696""##).count();
        assert_eq!(bars, 3, "{svg}");
    }

    #[test]
    fn texts_needs_well_formed_svg() {
        assert!(texts("<svg><text>a &amp; b</text></svg>").is_ok_and(|t| t == ["a & b"]));
        assert!(texts("<svg><text>a < b</text></svg>").is_err());
        assert!(texts("<html/>").is_err());
    }

    #[test]
    fn a_chart_without_panels_is_an_error() {
        let mut c = chart();
        c.panels.clear();
        assert!(svg(&c).is_err());
    }

    #[test]
    fn numbers_keep_the_digits_a_reader_compares() {
        assert_eq!(short_number(109.4), "109");
        assert_eq!(short_number(13.85), "13.8");
        assert_eq!(short_number(0.734), "0.73");
        assert_eq!(short_number(0.0), "0.0");
    }

    #[test]
    fn captions_wrap_at_spaces() {
        assert_eq!(wrap("aa bb cc", 5), ["aa bb", "cc"]);
        assert_eq!(wrap("a  b", 10), ["a b"]);
        assert_eq!(tick(5.0), "5");
        assert_eq!(tick(2.5), "2.5");
    }

    #[test]
    fn dates_from_days() {
        assert_eq!(civil_date(0), "1970-01-01");
        assert_eq!(civil_date(20_418), "2025-11-26");
        assert_eq!(civil_date(11_016), "2000-02-29");
    }

    #[test]
    fn the_chart_goes_beside_the_report() {
        assert_eq!(
            svg_path(Path::new("target/lab-bench.md")),
            Path::new("target/lab-bench.svg")
        );
    }
}
