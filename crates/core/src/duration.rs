//! The one duration grammar of larch: every CLI flag (`--diff-interval`, `--clock-allowance`…),
//! engine-config key (`poll_interval`) and CRD field (`diffInterval`, `pollInterval`, `maxAge`…).
//!
//! It is Go's `time.ParseDuration`, because that is what the API server's CEL `duration()`
//! evaluates in the CRDs' rules: a sign, then one or more decimal numbers each with a unit
//! (`ns`, `us`/`µs`/`μs`, `ms`, `s`, `m`, `h`), such as `300ms`, `1.5h`, `1h30m`, or a bare `0`.
//! Its range is Go's too (signed 64-bit nanoseconds, about ±292 years): larger values are an
//! error, never a panic or a wrap. The CRDs check their fields with [`CRD_PATTERN`] plus a CEL
//! rule over `duration(self)`, and the end-to-end suite runs one table of inputs through this
//! parser and through the real API server to keep the two in agreement.
//!
//! Two larch limits apply everywhere alike: at most [`MAX_TEXT`] bytes (the CRDs' maxLength),
//! and no negative durations. An *age* ([`parse_age`]) also takes whole days (`7d`).

use std::time::Duration;

/// The longest duration text accepted (the CRD fields' `maxLength`).
pub const MAX_TEXT: usize = 64;

/// The OpenAPI pattern of a duration field in the CRDs: the lexical part of Go's grammar (the
/// range and the sign are checked by the CEL rule next to it).
pub const CRD_PATTERN: &str = r"^[-+]?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$";

/// The CEL rule of a duration field that must be positive.
pub const CRD_POSITIVE_RULE: &str = "duration(self) > duration('0s')";

/// The CEL rule of an age field (`maxAge`): whole days up to [`MAX_DAYS`], or a positive duration.
pub const CRD_AGE_RULE: &str = "self.endsWith('d') ? (int(self.substring(0, size(self) - 1)) > 0 && int(self.substring(0, size(self) - 1)) <= 106751) : duration(self) > duration('0s')";

/// The OpenAPI pattern of an age field: whole days, or the duration grammar.
pub const CRD_AGE_PATTERN: &str =
    r"^([0-9]+d|[-+]?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+))$";

/// The most whole days an age may have: the days in Go's longest duration.
pub const MAX_DAYS: u64 = (i64::MAX as u64) / NANOS_PER_DAY;

const NANOS_PER_DAY: u64 = 86_400 * 1_000_000_000;
const LIMIT: u64 = 1 << 63;

/// Go's longest duration, for messages.
const LONGEST: &str = "2562047h47m16.854775807s, about 292 years";

fn invalid(text: &str) -> String {
    format!(
        "invalid duration {text:?}: expected numbers with units ns, us, ms, s, m or h, such as 300ms, 30s, 1h30m or 1.5h"
    )
}

fn out_of_range(text: &str) -> String {
    format!("duration {text:?} is out of range (the longest is {LONGEST})")
}

/// Consumes leading ASCII digits as an integer; `None` past 2^63 (Go's `leadingInt`).
fn leading_int(s: &str) -> (Option<u64>, &str) {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let mut x: u64 = 0;
    for b in s[..end].bytes() {
        if x > LIMIT / 10 {
            return (None, &s[end..]);
        }
        x = x * 10 + u64::from(b - b'0');
        if x > LIMIT {
            return (None, &s[end..]);
        }
    }
    (Some(x), &s[end..])
}

/// Consumes leading digits of a fraction, keeping the precision that fits (Go's
/// `leadingFraction`): (digits, 10^kept, rest).
fn leading_fraction(s: &str) -> (u64, f64, &str) {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (mut x, mut scale, mut overflow) = (0u64, 1f64, false);
    for b in s[..end].bytes() {
        if overflow {
            continue;
        }
        if x > (LIMIT - 1) / 10 {
            overflow = true;
            continue;
        }
        let y = x * 10 + u64::from(b - b'0');
        if y > LIMIT {
            overflow = true;
            continue;
        }
        x = y;
        scale *= 10.0;
    }
    (x, scale, &s[end..])
}

fn unit_nanos(unit: &str) -> Option<u64> {
    Some(match unit {
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

/// Parses Go's duration grammar into signed nanoseconds, exactly as `time.ParseDuration` does
/// (same accepted texts, same values); longer than [`MAX_TEXT`] is refused too.
pub fn parse_nanos(text: &str) -> Result<i64, String> {
    if text.len() > MAX_TEXT {
        return Err(format!(
            "duration {:?}… is longer than {MAX_TEXT} characters",
            text.chars().take(16).collect::<String>()
        ));
    }
    let mut s = text;
    let mut negative = false;
    if let Some(rest) = s.strip_prefix(['-', '+']) {
        negative = s.starts_with('-');
        s = rest;
    }
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid(text));
    }
    let mut total: u64 = 0;
    while !s.is_empty() {
        if !(s.starts_with('.') || s.starts_with(|c: char| c.is_ascii_digit())) {
            return Err(invalid(text));
        }
        let before = s.len();
        let (whole, rest) = leading_int(s);
        let Some(mut value) = whole else {
            return Err(out_of_range(text));
        };
        let pre = rest.len() != before;
        s = rest;
        let (mut fraction, mut scale, mut post) = (0u64, 1f64, false);
        if let Some(rest) = s.strip_prefix('.') {
            let before = rest.len();
            (fraction, scale, s) = leading_fraction(rest);
            post = s.len() != before;
        }
        if !pre && !post {
            return Err(invalid(text));
        }
        let unit_len = s
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(s.len());
        if unit_len == 0 {
            return Err(format!(
                "duration {text:?} lacks a unit after a number (ns, us, ms, s, m or h)"
            ));
        }
        let (unit, rest) = s.split_at(unit_len);
        s = rest;
        let Some(nanos) = unit_nanos(unit) else {
            return Err(format!(
                "duration {text:?}: unknown unit {unit:?} (ns, us, ms, s, m or h; no days)"
            ));
        };
        if value > LIMIT / nanos {
            return Err(out_of_range(text));
        }
        value *= nanos;
        if fraction > 0 {
            // As Go: float64 is exact enough for the fraction of an hour in nanoseconds.
            value += (fraction as f64 * (nanos as f64 / scale)) as u64;
            if value > LIMIT {
                return Err(out_of_range(text));
            }
        }
        total += value;
        if total > LIMIT {
            return Err(out_of_range(text));
        }
    }
    if negative {
        return Ok((-(total as i128)) as i64);
    }
    i64::try_from(total).map_err(|_| out_of_range(text))
}

/// A duration that may be zero (`--clock-allowance 0`), never negative.
pub fn parse_non_negative(text: &str) -> Result<Duration, String> {
    let nanos = parse_nanos(text)?;
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .map_err(|_| format!("duration {text:?} must not be negative"))
}

/// A duration greater than zero (intervals, timeouts).
pub fn parse_positive(text: &str) -> Result<Duration, String> {
    let d = parse_non_negative(text)?;
    if d.is_zero() {
        return Err(format!("duration {text:?} must be greater than zero"));
    }
    Ok(d)
}

/// An age (`--max-age`, `retention.maxAge`): a positive duration, or whole days (`7d`, at most
/// [`MAX_DAYS`]).
pub fn parse_age(text: &str) -> Result<Duration, String> {
    if let Some(days) = text.strip_suffix('d')
        && !days.is_empty()
        && days.bytes().all(|b| b.is_ascii_digit())
    {
        if text.len() > MAX_TEXT {
            return Err(format!("age {text:?} is longer than {MAX_TEXT} characters"));
        }
        return match days.parse::<u64>() {
            Ok(0) => Err(format!("age {text:?} must be greater than zero")),
            Ok(n) if n <= MAX_DAYS => Ok(Duration::from_secs(n * 86_400)),
            _ => Err(format!(
                "age {text:?} is out of range (at most {MAX_DAYS}d, about 292 years)"
            )),
        };
    }
    parse_positive(text).map_err(|e| format!("{e}; an age may also be whole days, such as 7d"))
}

/// Texts on both sides of every edge of the grammar and the range: the CRD tests and the
/// end-to-end suite put each into every duration field and expect the API server to accept
/// exactly those this parser accepts.
pub const AGREEMENT_CASES: &[&str] = &[
    "30s",
    "500ms",
    "1h30m",
    "1.5h",
    ".5s",
    "1.s",
    "2us",
    "2\u{b5}s",
    "2\u{3bc}s",
    "1ns",
    "+5s",
    "1h1m1s1ms1us1ns",
    "2562047h",
    "2562047h47m16.854775807s",
    "2562047h47m16.854775808s",
    "2562048h",
    "9223372036854775807ns",
    "9223372036854775808ns",
    "99999999999999999999h",
    "0",
    "0s",
    "-0",
    "-5s",
    "5",
    "5x",
    "1d",
    "7d",
    "106751d",
    "106752d",
    "0d",
    "1.5d",
    "5 s",
    "s",
    ".s",
    "",
    "1e3s",
    "1h0m0s0ms0us0ns1h0m0s0ms0us0ns1h0m0s0ms0us0ns1h0m0s0ms0us0ns000s", // 64 bytes
    "1h0m0s0ms0us0ns1h0m0s0ms0us0ns1h0m0s0ms0us0ns1h0m0s0ms0us0ns0000s", // 65 bytes
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Values Go's `time.ParseDuration` returns for these texts (checked with Go 1.26.8).
    #[test]
    fn go_values() {
        for (text, nanos) in [
            ("0", 0i64),
            ("-0", 0),
            ("+0", 0),
            ("0s", 0),
            ("5s", 5_000_000_000),
            ("300ms", 300_000_000),
            ("-1.5h", -5_400_000_000_000),
            ("1h30m", 5_400_000_000_000),
            ("1.5h", 5_400_000_000_000),
            (".5s", 500_000_000),
            ("1.s", 1_000_000_000),
            ("2us", 2_000),
            ("2\u{b5}s", 2_000),
            ("2\u{3bc}s", 2_000),
            ("1ns", 1),
            ("1h1m1s1ms1us1ns", 3_661_001_001_001),
            ("0.3333333333333333333h", 1_200_000_000_000),
            ("9223372036854775807ns", i64::MAX),
            ("-9223372036854775808ns", i64::MIN),
            ("2562047h47m16.854775807s", i64::MAX),
        ] {
            assert_eq!(parse_nanos(text), Ok(nanos), "{text}");
        }
    }

    #[test]
    fn go_refusals() {
        for text in [
            "",
            "-",
            "s",
            ".s",
            "5",
            "5x",
            "1d",
            "5 s",
            " 5s",
            "1e3s",
            "1h 30m",
            "--5s",
            "9223372036854775808ns",
            "2562048h",
            "99999999999999999999h",
            "18446744073709551616ns",
        ] {
            assert!(parse_nanos(text).is_err(), "{text:?}");
        }
        assert!(
            parse_nanos("99999999999999999999h")
                .unwrap_err()
                .contains("out of range")
        );
        assert!(parse_nanos(&"1s".repeat(40)).unwrap_err().contains("64"));
        let lengths: Vec<usize> = AGREEMENT_CASES
            .iter()
            .rev()
            .take(2)
            .map(|c| c.len())
            .collect();
        assert_eq!(lengths, [65, 64]);
    }

    #[test]
    fn larch_limits() {
        assert_eq!(parse_positive("30s"), Ok(Duration::from_secs(30)));
        assert!(
            parse_positive("0s")
                .unwrap_err()
                .contains("greater than zero")
        );
        assert!(parse_positive("-5s").unwrap_err().contains("negative"));
        assert_eq!(parse_non_negative("0"), Ok(Duration::ZERO));
        assert_eq!(parse_age("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_age("36h"), Ok(Duration::from_secs(36 * 3_600)));
        assert_eq!(MAX_DAYS, 106_751);
        assert!(parse_age("106751d").is_ok());
        assert!(parse_age("106752d").unwrap_err().contains("out of range"));
        assert!(
            parse_age("999999999999999999999d")
                .unwrap_err()
                .contains("out of range")
        );
        assert!(parse_age("0d").is_err());
        assert!(parse_age("1.5d").unwrap_err().contains("7d"));
    }

    #[test]
    fn the_age_pattern_and_rule_extend_the_duration_ones() {
        assert!(CRD_AGE_PATTERN.contains(&CRD_PATTERN[1..CRD_PATTERN.len() - 1]));
        assert!(CRD_AGE_RULE.contains(&MAX_DAYS.to_string()));
        assert!(CRD_AGE_RULE.ends_with(CRD_POSITIVE_RULE));
    }
}
