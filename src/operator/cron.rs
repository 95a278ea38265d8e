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
    for (field, bounds) in fields.iter().zip([MINUTES, HOURS, DOM, MONTHS, DOW]) {
        // strings.FieldsFunc on ',': empty items are skipped, not refused.
        for expr in field.split(',').filter(|e| !e.is_empty()) {
            range(expr, &bounds)?;
        }
    }
    Ok(())
}

/// `number | number "-" number [ "/" number ]`, `*` or `?` (robfig's getRange).
fn range(expr: &str, r: &Bounds) -> Result<(), String> {
    let range_and_step: Vec<&str> = expr.split('/').collect();
    let low_and_high: Vec<&str> = range_and_step[0].split('-').collect();
    let single = low_and_high.len() == 1;
    let (start, mut end) = if low_and_high[0] == "*" || low_and_high[0] == "?" {
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
    Ok(())
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
fn descriptor(d: &str) -> Result<(), String> {
    const NAMED: [&str; 7] = [
        "@yearly",
        "@annually",
        "@monthly",
        "@weekly",
        "@daily",
        "@midnight",
        "@hourly",
    ];
    if NAMED.contains(&d) {
        return Ok(());
    }
    match d.strip_prefix("@every ") {
        Some(duration) => {
            go_duration(duration).map_err(|e| format!("failed to parse duration {d}: {e}"))
        }
        None => Err(format!("unrecognized descriptor: {d}")),
    }
}

/// Go's time.ParseDuration grammar: `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+` (or `0`), units ns, us
/// (µs, μs), ms, s, m, h, the total within ±2^63 ns. robfig accepts any value (it rounds up to
/// one second).
fn go_duration(s: &str) -> Result<(), String> {
    let invalid = || format!("time: invalid duration {s:?}");
    let mut rest = s;
    if let Some(r) = rest.strip_prefix(['-', '+']) {
        rest = r;
    }
    if rest == "0" {
        return Ok(());
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_schedule;

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
