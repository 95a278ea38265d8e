//! How a progress report reads on a terminal: human numbers (`254.5k rows/s`, `12.3 MiB/s`),
//! one line per operation that fits the terminal's width (cut, never wrapped), and `starting…`
//! before the first row rather than `0/0 rows`.

use crate::progress::ProgressReport;
use crate::units::format_bytes;

/// The width assumed when the terminal does not say its own.
pub const DEFAULT_WIDTH: usize = 80;

/// The widest bar drawn, and the narrowest worth drawing.
const BAR_MAX: usize = 30;
const BAR_MIN: usize = 10;

/// A count as people read it: `950`, `12.3k`, `254.5k`, `1.2M`, `3.4G`.
pub fn human_count(n: f64) -> String {
    let n = n.max(0.0);
    if n < 1_000.0 {
        return format!("{}", n.round() as u64);
    }
    let (v, unit) = if n < 999_950.0 {
        (n / 1e3, "k")
    } else if n < 999_950_000.0 {
        (n / 1e6, "M")
    } else {
        (n / 1e9, "G")
    };
    format!("{v:.1}{unit}")
}

/// `254.5k rows/s`.
pub fn rows_rate(per_second: f64) -> String {
    format!("{} rows/s", human_count(per_second))
}

/// `12.3 MiB/s`.
pub fn bytes_rate(per_second: f64) -> String {
    format!("{}/s", format_bytes(per_second.max(0.0).round() as u64))
}

/// `5s`, `2m05s`, `1h02m`.
pub fn format_seconds(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// `text` cut to at most `width` characters (the last one `…` when cut).
pub fn fit(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
    if width > 0 {
        cut.push('…');
    }
    cut
}

/// The figures after the bar: `120.0k/~200.0k rows 60% 40.0k rows/s 3.0 MiB/s ETA 2s`;
/// `starting…` before the first row.
fn figures(r: &ProgressReport) -> String {
    if r.rows == 0 && !r.done {
        return match r.total_rows {
            Some(t) => format!("starting… (~{} rows)", human_count(t as f64)),
            None => "starting…".to_string(),
        };
    }
    let mut s = human_count(r.rows as f64);
    if let Some(t) = r.total_rows {
        s.push_str(&format!("/~{}", human_count(t as f64)));
    }
    s.push_str(" rows");
    if let Some(p) = r.percent {
        s.push_str(&format!(" {p:.0}%"));
    }
    s.push_str(&format!(" {}", rows_rate(r.rows_per_second)));
    if r.bytes > 0 {
        s.push_str(&format!(" {}", bytes_rate(r.bytes_per_second)));
    }
    match r.eta_seconds {
        _ if r.done => s.push_str(&format!(" in {}", format_seconds(r.elapsed_seconds))),
        Some(eta) => s.push_str(&format!(" ETA {}", format_seconds(eta))),
        None => {}
    }
    s
}

/// `[=======>      ]` of `width` characters inside the brackets.
fn bar(percent: f64, width: usize) -> String {
    let filled = ((percent.clamp(0.0, 100.0) / 100.0) * width as f64).floor() as usize;
    let mut s = String::with_capacity(width + 2);
    s.push('[');
    s.push_str(&"=".repeat(filled.min(width)));
    if filled < width {
        s.push('>');
        s.push_str(&" ".repeat(width - filled - 1));
    }
    s.push(']');
    s
}

/// One operation's line, at most `width - 1` characters (a line filling the last column makes
/// some terminals wrap): `{label} [bar] {figures}`, the bar narrowed or left out first, then the
/// line cut.
pub fn render(label: &str, r: &ProgressReport, width: usize) -> String {
    let room = width.saturating_sub(1);
    let figures = figures(r);
    let text_len = label.chars().count() + 1 + figures.chars().count();
    let bar_width = room.saturating_sub(text_len + 3).min(BAR_MAX);
    let line = match r.percent {
        Some(p) if r.rows > 0 && bar_width >= BAR_MIN => {
            format!("{label} {} {figures}", bar(p, bar_width))
        }
        _ => format!("{label} {figures}"),
    };
    fit(&line, room)
}

/// The terminal's width on stderr, else [`DEFAULT_WIDTH`].
pub fn stderr_width() -> usize {
    // SAFETY: TIOCGWINSZ fills the winsize it is given; fd 2 outlives the call.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(2, libc::TIOCGWINSZ, &mut size) } == 0;
    if ok && size.ws_col > 0 {
        size.ws_col as usize
    } else {
        DEFAULT_WIDTH
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::compute;
    use std::time::Duration;

    #[test]
    fn rates_are_human_numbers() {
        assert_eq!(rows_rate(254_457.687_6), "254.5k rows/s");
        assert_eq!(rows_rate(999.4), "999 rows/s");
        assert_eq!(rows_rate(999_999.0), "1.0M rows/s");
        assert_eq!(rows_rate(1_234_567.0), "1.2M rows/s");
        assert_eq!(rows_rate(0.0), "0 rows/s");
        assert_eq!(bytes_rate(12.3 * 1024.0 * 1024.0), "12.3 MiB/s");
        assert_eq!(bytes_rate(512.0), "512 B/s");
        assert_eq!(format_seconds(3725.0), "1h02m");
        assert_eq!(format_seconds(125.0), "2m05s");
    }

    #[test]
    fn a_line_shows_counts_rates_and_eta_without_long_decimals() {
        // The rate: 254 457.7 rows/s.
        let r = compute(
            2_544_577,
            123 << 20,
            Some(5_000_000),
            Duration::from_secs(10),
        );
        let line = render("restore of public.t", &r, 200);
        assert!(line.starts_with("restore of public.t [="), "{line}");
        assert!(
            line.ends_with("] 2.5M/~5.0M rows 51% 254.5k rows/s 12.3 MiB/s ETA 10s"),
            "{line}"
        );
    }

    #[test]
    fn the_first_frame_says_starting_not_zero_of_zero() {
        let unknown = compute(0, 0, None, Duration::ZERO);
        assert_eq!(
            render("baseline of t", &unknown, 80),
            "baseline of t starting…"
        );
        let known = compute(0, 0, Some(1_000_000), Duration::from_secs(1));
        assert_eq!(
            render("restore of t", &known, 80),
            "restore of t starting… (~1.0M rows)"
        );
    }

    #[test]
    fn a_line_fits_the_width_narrowing_the_bar_then_cutting() {
        let r = compute(500_000, 50 << 20, Some(1_000_000), Duration::from_secs(2));
        for width in [20, 40, 60, 80, 120] {
            let line = render("restore of public.a_rather_long_table_name", &r, width);
            assert!(line.chars().count() < width, "{width}: {line:?}");
        }
        let narrow = render("restore of public.a_rather_long_table_name", &r, 60);
        assert!(!narrow.contains('['), "no room for a bar: {narrow}");
        assert!(narrow.ends_with('…'), "{narrow}");
        let wide = render("restore of t", &r, 120);
        assert!(wide.contains(&format!("[{}>", "=".repeat(15))), "{wide}");
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit("abc", 4), "abc");
    }
}
