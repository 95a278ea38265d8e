//! Shared by the benchmark examples: rows shaped like `shared/bench/events.sql` (as larch's
//! PostgreSQL mapping renders them) and the process's peak RSS.

pub fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// One row of `public.events` as larch's PostgreSQL mapping renders it.
pub fn event_row(g: u64) -> String {
    let kind = match g % 3 {
        0 => "\"click\"",
        1 => "\"view\"",
        _ => "null",
    };
    let md5 = format!(
        "{:032x}",
        (g as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835)
    );
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        &md5[0..8],
        &md5[8..12],
        &md5[12..16],
        &md5[16..20],
        &md5[20..32]
    );
    let secs = g;
    let ts = format!(
        "2026-01-{:02}T{:02}:{:02}:{:02}Z",
        1 + (secs / 86400) % 28,
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60
    );
    format!(
        r#"{{"amount":{}.{:02},"blob":"{}","created_at":"{}","flag":{},"id":{},"kind":{},"payload":{{"n":{},"nested":{{"ok":{}}},"s":"{}"}},"ref":"{}","tags":["a{}","b{}"],"tenant":"tenant-{}"}}"#,
        (g % 10000) / 100,
        (g % 10000) % 100,
        &md5[0..12],
        ts,
        g.is_multiple_of(2),
        g,
        kind,
        g,
        g.is_multiple_of(2),
        md5,
        uuid,
        g % 7,
        g % 11,
        g % 100
    )
}
