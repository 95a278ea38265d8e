//! CronJob schedules as Kubernetes validates them: `cron.ParseStandard` of robfig/cron v3
//! (five fields — minute, hour, day of month, month, day of week — or a descriptor such as
//! `@daily` or `@every 1h30m`) plus the API server's own rule that `TZ` may not appear (the
//! time zone is `timeZone`). A schedule this accepts is one the API server accepts, and the
//! errors are robfig's words, so the operator can refuse a bad schedule before it builds the
//! CronJob. The grammar's corners (empty list items, `*-5`, `+5`) follow robfig, checked
//! against it case by case (the table in the tests).

/// One field's bounds and names (robfig's `bounds`).
struct Bounds {
    min: u64,
    max: u64,
    names: &'static [(&'static str, u64)],
}

const MINUTES: Bounds = Bounds {
    min: 0,
    max: 59,
    names: &[],
};
const HOURS: Bounds = Bounds {
    min: 0,
    max: 23,
    names: &[],
};
const DOM: Bounds = Bounds {
    min: 1,
    max: 31,
    names: &[],
};
const MONTHS: Bounds = Bounds {
    min: 1,
    max: 12,
    names: &[
        ("jan", 1),
        ("feb", 2),
        ("mar", 3),
        ("apr", 4),
        ("may", 5),
        ("jun", 6),
        ("jul", 7),
        ("aug", 8),
        ("sep", 9),
        ("oct", 10),
        ("nov", 11),
        ("dec", 12),
    ],
};
const DOW: Bounds = Bounds {
    min: 0,
    max: 6,
    names: &[
        ("sun", 0),
        ("mon", 1),
        ("tue", 2),
        ("wed", 3),
        ("thu", 4),
        ("fri", 5),
        ("sat", 6),
    ],
};

/// Checks `schedule` as the API server checks a CronJob's `spec.schedule`; the error says
/// what is wrong in robfig's words.
pub fn check_schedule(schedule: &str) -> Result<(), String> {
    parse(schedule).map(|_| ())
}

/// A parsed schedule (robfig's SpecSchedule or ConstantDelaySchedule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parsed {
    /// One bit per allowed value of minute, hour, day of month, month, day of week; bit 63
    /// (robfig's starBit) on a field written `*` or `?` without a step above 1.
    Fields([u64; 5]),
    /// `@every`: nanoseconds between runs.
    Every(i128),
}

const STAR: u64 = 1 << 63;

fn parse(schedule: &str) -> Result<Parsed, String> {
    if schedule.contains("TZ") {
        return Err("cannot use TZ or CRON_TZ in schedule, use timeZone field instead".into());
    }
    if schedule.is_empty() {
        return Err("empty spec string".into());
    }
    if schedule.starts_with('@') {
        return descriptor(schedule);
    }
    // Go's strings.Fields: split on Unicode white space.
    let fields: Vec<&str> = schedule.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!(
            "expected exactly 5 fields, found {}: [{}]",
            fields.len(),
            fields.join(" ")
        ));
    }
    let mut bits = [0u64; 5];
    for (i, (field, bounds)) in fields
        .iter()
        .zip([MINUTES, HOURS, DOM, MONTHS, DOW])
        .enumerate()
    {
        // strings.FieldsFunc on ',': empty items are skipped, not refused.
        for expr in field.split(',').filter(|e| !e.is_empty()) {
            bits[i] |= range(expr, &bounds)?;
        }
    }
    Ok(Parsed::Fields(bits))
}

/// The first time after `after` that `schedule` fires, in `time_zone` (IANA; UTC when
/// `None`), as the CronJob controller schedules it: robfig's `Next` (day of month and day of
/// week: both must match when either is `*`, else either). `@every` counts from `after`.
/// `None` when it never fires in the next five years (`0 0 31 2 *`).
pub fn next_after(
    schedule: &str,
    time_zone: Option<&str>,
    after: jiff::Timestamp,
) -> Result<Option<jiff::Timestamp>, String> {
    use jiff::{ToSpan, civil::DateTime};
    let tz = match time_zone {
        Some(name) => {
            jiff::tz::TimeZone::get(name).map_err(|e| format!("timeZone {name:?}: {e}"))?
        }
        None => jiff::tz::TimeZone::UTC,
    };
    let bits = match parse(schedule)? {
        Parsed::Every(nanos) => {
            // robfig: at least a second, whole seconds.
            let secs = (nanos / 1_000_000_000).max(1) as i64;
            let next = jiff::Timestamp::from_second(after.as_second() + secs)
                .map_err(|e| e.to_string())?;
            return Ok(Some(next));
        }
        Parsed::Fields(bits) => bits,
    };
    let [minute, hour, dom, month, dow] = bits;
    let has = |set: u64, v: i8| set & (1 << v as u64) != 0;
    let day_matches = |d: DateTime| {
        let dom_match = has(dom, d.day());
        let dow_match = has(dow, d.weekday().to_sunday_zero_offset());
        if dom & STAR != 0 || dow & STAR != 0 {
            dom_match && dow_match
        } else {
            dom_match || dow_match
        }
    };
    let start = after.to_zoned(tz.clone()).datetime();
    // The next whole minute.
    let mut t = start
        .with()
        .second(0)
        .subsec_nanosecond(0)
        .build()
        .map_err(|e| e.to_string())?
        .checked_add(1.minute())
        .map_err(|e| e.to_string())?;
    let limit = start.year() + 5;
    let step = |t: DateTime, span: jiff::Span| t.checked_add(span).map_err(|e| e.to_string());
    while t.year() <= limit {
        if !has(month, t.month()) {
            t = step(t.first_of_month().start_of_day(), 1.month())?;
        } else if !day_matches(t) {
            t = step(t.start_of_day(), 1.day())?;
        } else if !has(hour, t.hour()) {
            t = step(
                t.with().minute(0).build().map_err(|e| e.to_string())?,
                1.hour(),
            )?;
        } else if !has(minute, t.minute()) {
            t = step(t, 1.minute())?;
        } else {
            let at = tz
                .to_ambiguous_zoned(t)
                .compatible()
                .map_err(|e| e.to_string())?
                .timestamp();
            // A time skipped by a DST change maps to the next one that exists.
            if at > after {
                return Ok(Some(at));
            }
            t = step(t, 1.minute())?;
        }
    }
    Ok(None)
}

/// `number | number "-" number [ "/" number ]`, `*` or `?` (robfig's getRange): the bits of
/// the values it allows.
fn range(expr: &str, r: &Bounds) -> Result<u64, String> {
    let range_and_step: Vec<&str> = expr.split('/').collect();
    let low_and_high: Vec<&str> = range_and_step[0].split('-').collect();
    let single = low_and_high.len() == 1;
    let star = low_and_high[0] == "*" || low_and_high[0] == "?";
    let (start, mut end) = if star {
        // robfig ignores anything after `*-`.
        (r.min, r.max)
    } else {
        let start = int_or_name(low_and_high[0], r)?;
        match low_and_high.len() {
            1 => (start, start),
            2 => (start, int_or_name(low_and_high[1], r)?),
            _ => return Err(format!("too many hyphens: {expr}")),
        }
    };
    let step = match range_and_step.len() {
        1 => 1,
        2 => {
            let step = int(range_and_step[1])?;
            // "N/step" means "N-max/step".
            if single {
                end = r.max;
            }
            step
        }
        _ => return Err(format!("too many slashes: {expr}")),
    };
    if start < r.min {
        return Err(format!(
            "beginning of range ({start}) below minimum ({}): {expr}",
            r.min
        ));
    }
    if end > r.max {
        return Err(format!(
            "end of range ({end}) above maximum ({}): {expr}",
            r.max
        ));
    }
    if start > end {
        return Err(format!(
            "beginning of range ({start}) beyond end of range ({end}): {expr}"
        ));
    }
    if step == 0 {
        return Err(format!("step of range should be a positive number: {expr}"));
    }
    let mut bits = (start..=end)
        .step_by(step as usize)
        .fold(0u64, |b, v| b | 1 << v);
    if star && step == 1 {
        bits |= STAR;
    }
    Ok(bits)
}

fn int_or_name(expr: &str, r: &Bounds) -> Result<u64, String> {
    let lower = expr.to_lowercase();
    match r.names.iter().find(|(n, _)| *n == lower) {
        Some((_, v)) => Ok(*v),
        None => int(expr),
    }
}

/// Go's strconv.Atoi (an optional sign, decimal digits, within 64 bits), then robfig's
/// refusal of negative numbers.
fn int(expr: &str) -> Result<u64, String> {
    let invalid = || {
        format!("failed to parse int from {expr}: strconv.Atoi: parsing {expr:?}: invalid syntax")
    };
    let (negative, digits) = match expr.as_bytes().first() {
        Some(b'+') => (false, &expr[1..]),
        Some(b'-') => (true, &expr[1..]),
        _ => (false, expr),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    let Ok(value) = digits.parse::<i64>() else {
        return Err(format!(
            "failed to parse int from {expr}: strconv.Atoi: parsing {expr:?}: value out of range"
        ));
    };
    if negative && value != 0 {
        return Err(format!("negative number (-{value}) not allowed: {expr}"));
    }
    Ok(value as u64)
}

/// `@yearly` … `@hourly`, or `@every <Go duration>` (robfig's parseDescriptor).
fn descriptor(d: &str) -> Result<Parsed, String> {
    const NAMED: [(&str, &str); 7] = [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
    ];
    if let Some((_, fields)) = NAMED.iter().find(|(n, _)| *n == d) {
        return parse(fields);
    }
    match d.strip_prefix("@every ") {
        Some(duration) => go_duration(duration)
            .map(Parsed::Every)
            .map_err(|e| format!("failed to parse duration {d}: {e}")),
        None => Err(format!("unrecognized descriptor: {d}")),
    }
}

/// Go's time.ParseDuration grammar: `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+` (or `0`), units ns, us
/// (µs, μs), ms, s, m, h, the total within ±2^63 ns. robfig accepts any value (it rounds up to
/// one second).
fn go_duration(s: &str) -> Result<i128, String> {
    let invalid = || format!("time: invalid duration {s:?}");
    let mut rest = s;
    if let Some(r) = rest.strip_prefix(['-', '+']) {
        rest = r;
    }
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int_part, after) = rest.split_at(int_len);
        let (frac_part, after) = match after.strip_prefix('.') {
            Some(a) => {
                let n = a.bytes().take_while(u8::is_ascii_digit).count();
                a.split_at(n)
            }
            None => ("", after),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            // No digits at all (".s", "h").
            return Err(invalid());
        }
        let unit_len = after
            .char_indices()
            .find(|(_, c)| *c == '.' || c.is_ascii_digit())
            .map_or(after.len(), |(i, _)| i);
        let (unit, after) = after.split_at(unit_len);
        let nanos: u128 = match unit {
            "" => return Err(format!("time: missing unit in duration {s:?}")),
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            other => return Err(format!("time: unknown unit {other:?} in duration {s:?}")),
        };
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| invalid())?
        };
        // Go keeps the fraction's first digits that fit; a bound check is enough here.
        let frac: u128 = frac_part
            .bytes()
            .take(18)
            .fold(0, |a, b| a * 10 + u128::from(b - b'0'));
        let scale = 10u128.pow(frac_part.len().min(18) as u32);
        total = total
            .checked_add(whole.checked_mul(nanos).ok_or_else(invalid)?)
            .and_then(|t| t.checked_add(frac * nanos / scale))
            .ok_or_else(invalid)?;
        if total > 1 << 63 {
            return Err(invalid());
        }
        rest = after;
    }
    if total == 1 << 63 && !s.starts_with('-') {
        return Err(invalid());
    }
    let total = total as i128;
    Ok(if s.starts_with('-') { -total } else { total })
}

#[cfg(test)]
mod tests {
    use super::{check_schedule, next_after};

    #[test]
    fn the_next_run_is_what_the_cronjob_controller_schedules() {
        let at = |s: &str| s.parse::<jiff::Timestamp>().unwrap();
        // Thursday 2027-01-14 10:17:30 UTC.
        let now = at("2027-01-14T10:17:30Z");
        let next = |cron: &str, tz: Option<&str>| {
            next_after(cron, tz, now).unwrap().map(|t| t.to_string())
        };
        let cases: &[(&str, Option<&str>, Option<&str>)] = &[
            ("0 2 * * *", None, Some("2027-01-15T02:00:00Z")),
            ("*/5 * * * *", None, Some("2027-01-14T10:20:00Z")),
            ("17 10 * * *", None, Some("2027-01-15T10:17:00Z")),
            ("@hourly", None, Some("2027-01-14T11:00:00Z")),
            ("@weekly", None, Some("2027-01-17T00:00:00Z")),
            ("@yearly", None, Some("2028-01-01T00:00:00Z")),
            // Either day field matches when neither is `*`: the 20th or a Monday.
            ("0 0 20 * mon", None, Some("2027-01-18T00:00:00Z")),
            // Both when one is `*` (`*/1` too): Mondays only.
            ("0 0 * * 1", None, Some("2027-01-18T00:00:00Z")),
            ("0 0 */1 * 5", None, Some("2027-01-15T00:00:00Z")),
            ("0 0 29 2 *", None, Some("2028-02-29T00:00:00Z")),
            ("0 0 31 2 *", None, None),
            // 02:00 in Berlin (UTC+1 in winter).
            (
                "0 2 * * *",
                Some("Europe/Berlin"),
                Some("2027-01-15T01:00:00Z"),
            ),
            ("@every 1h30m", None, Some("2027-01-14T11:47:30Z")),
        ];
        for (cron, tz, want) in cases {
            assert_eq!(next(cron, *tz).as_deref(), *want, "{cron} {tz:?}");
        }
        assert!(
            next_after("0 2 * * *", Some("Mars/Olympus"), now)
                .unwrap_err()
                .contains("Mars/Olympus")
        );
        assert!(next_after("61 * * * *", None, now).is_err());
        // 02:30 does not exist in Berlin on 2027-03-28 (clocks jump 02:00 -> 03:00).
        let spring = at("2027-03-28T00:00:00Z");
        assert_eq!(
            next_after("30 2 * * *", Some("Europe/Berlin"), spring)
                .unwrap()
                .unwrap()
                .to_string(),
            "2027-03-28T01:30:00Z"
        );
    }

    /// (schedule, accepted, error text) — each row checked against robfig/cron v3.0.1's
    /// ParseStandard (the parser Kubernetes 1.37 validates CronJobs with).
    const CASES: &[(&str, bool, &str)] = &[
        ("0 2 * * *", true, ""),
        ("*/5 * * * *", true, ""),
        ("0 0 1,15 * mon-fri", true, ""),
        ("0 0 * JAN,Dec SUN", true, ""),
        ("5/15 * * * *", true, ""),
        ("1-10/3 0 * * ?", true, ""),
        ("0 0 31 2 *", true, ""),
        ("1,,2 * * * *", true, ""),
        (", * * * *", true, ""),
        ("*-5 * * * *", true, ""),
        ("+5 * * * *", true, ""),
        ("05 07 * * *", true, ""),
        ("0\t2 * *  *", true, ""),
        ("@daily", true, ""),
        ("@midnight", true, ""),
        ("@annually", true, ""),
        ("@every 1h30m", true, ""),
        ("@every 0", true, ""),
        ("@every -5m", true, ""),
        ("@every 1.5s", true, ""),
        ("@every .5h", true, ""),
        ("@every 300ms", true, ""),
        (
            "61 25 * * *",
            false,
            "end of range (61) above maximum (59): 61",
        ),
        (
            "0 25 * * *",
            false,
            "end of range (25) above maximum (23): 25",
        ),
        (
            "0 0 0 * *",
            false,
            "beginning of range (0) below minimum (1): 0",
        ),
        (
            "0 0 * 13 *",
            false,
            "end of range (13) above maximum (12): 13",
        ),
        ("0 0 * * 7", false, "end of range (7) above maximum (6): 7"),
        (
            "5-1 * * * *",
            false,
            "beginning of range (5) beyond end of range (1): 5-1",
        ),
        (
            "*/0 * * * *",
            false,
            "step of range should be a positive number: */0",
        ),
        ("1-2-3 * * * *", false, "too many hyphens: 1-2-3"),
        ("*/2/3 * * * *", false, "too many slashes: */2/3"),
        ("-5 * * * *", false, "failed to parse int from : "),
        (
            "*/-5 * * * *",
            false,
            "negative number (-5) not allowed: -5",
        ),
        ("x * * * *", false, "failed to parse int from x: "),
        (
            "0 0 * january *",
            false,
            "failed to parse int from january: ",
        ),
        ("99999999999999999999 * * * *", false, "value out of range"),
        (
            "0 2 * *",
            false,
            "expected exactly 5 fields, found 4: [0 2 * *]",
        ),
        (
            "0 0 2 * * *",
            false,
            "expected exactly 5 fields, found 6: [0 0 2 * * *]",
        ),
        ("", false, "empty spec string"),
        (
            " @daily",
            false,
            "expected exactly 5 fields, found 1: [@daily]",
        ),
        ("@daily ", false, "unrecognized descriptor: @daily "),
        ("@Daily", false, "unrecognized descriptor: @Daily"),
        ("@reboot", false, "unrecognized descriptor: @reboot"),
        ("@every", false, "unrecognized descriptor: @every"),
        ("@every 1x", false, "unknown unit \"x\" in duration \"1x\""),
        ("@every 5", false, "missing unit in duration \"5\""),
        (
            "@every 1h 30m",
            false,
            "unknown unit \"h \" in duration \"1h 30m\"",
        ),
        ("@every .", false, "invalid duration \".\""),
        (
            "CRON_TZ=UTC 0 2 * * *",
            false,
            "cannot use TZ or CRON_TZ in schedule, use timeZone field instead",
        ),
    ];

    #[test]
    fn schedules_are_checked_as_kubernetes_checks_them() {
        for (schedule, accepted, error) in CASES {
            match check_schedule(schedule) {
                Ok(()) => assert!(accepted, "{schedule:?} must be refused ({error})"),
                Err(e) => {
                    assert!(!accepted, "{schedule:?} must be accepted, got {e}");
                    assert!(e.contains(error), "{schedule:?}: {e:?} lacks {error:?}");
                }
            }
        }
    }
}
