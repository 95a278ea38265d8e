//! Value mapping: one converter from (PostgreSQL type, text output) to a JSON value, used by the
//! baseline (COPY in text format) and the stream (pgoutput text tuples) alike, so a column has
//! one JSON type everywhere. The mapping is documented in `docs/postgres-types.md`.
//!
//! Both connections pin the settings that shape text output (`DateStyle=ISO`, `TimeZone=UTC`,
//! `IntervalStyle=iso_8601`, `extra_float_digits=1`, `bytea_output=hex`), see
//! [`super::config::SESSION_OPTIONS`]; the converter still accepts any offset and the escape
//! form of bytea.

use base64::Engine as _;
use chrono::{DateTime, FixedOffset, NaiveDate, NaiveDateTime, NaiveTime, Utc};
use serde::de::IgnoredAny;

use larch_archive::value::{Value, raw, string_value};

/// How a column's text is mapped to JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// int2, int4, int8 (and oid-like integers): the integer literal.
    Int,
    /// numeric: the exact literal keeping its scale; NaN/±Infinity as strings.
    Numeric,
    /// float4, float8: PostgreSQL's shortest round-trip text; NaN/±Infinity as strings.
    Float,
    Bool,
    /// json, jsonb: embedded JSON (compacted).
    Json,
    /// bytea: base64 (standard alphabet, padded).
    Bytea,
    /// timestamp without time zone: `YYYY-MM-DDTHH:MM:SS[.ffffff]Z` (read as UTC).
    Timestamp,
    /// timestamptz: converted to UTC, `YYYY-MM-DDTHH:MM:SS[.ffffff]Z`.
    Timestamptz,
    /// date: `YYYY-MM-DD`.
    Date,
    /// time: `HH:MM:SS[.ffffff]`.
    Time,
    /// timetz: `HH:MM:SS[.ffffff]±HH:MM`.
    Timetz,
    /// An array of `elem`, elements separated by `delim` in the text form.
    Array {
        elem: Box<Kind>,
        delim: u8,
    },
    /// text, varchar, bpchar, name, uuid, enums, and every other type: the text as a string.
    Text,
}

impl Kind {
    /// The kind of a base (non-array, non-domain) type by its `pg_type.typname`; `typtype` is
    /// `pg_type.typtype` (enums are `e`).
    pub fn of_base(typname: &str) -> Kind {
        match typname {
            "int2" | "int4" | "int8" | "oid" | "xid" | "cid" => Kind::Int,
            "numeric" => Kind::Numeric,
            "float4" | "float8" => Kind::Float,
            "bool" => Kind::Bool,
            "json" | "jsonb" => Kind::Json,
            "bytea" => Kind::Bytea,
            "timestamp" => Kind::Timestamp,
            "timestamptz" => Kind::Timestamptz,
            "date" => Kind::Date,
            "time" => Kind::Time,
            "timetz" => Kind::Timetz,
            _ => Kind::Text,
        }
    }
}

/// Maps one non-NULL value in PostgreSQL text output form to its JSON value.
pub fn to_json(kind: &Kind, text: &str) -> Value {
    match kind {
        Kind::Int => {
            if is_json_number(text) {
                raw(text)
            } else {
                string_value(text)
            }
        }
        Kind::Numeric | Kind::Float => {
            // NaN, Infinity, -Infinity are not JSON numbers.
            if is_json_number(text) {
                raw(text)
            } else {
                string_value(text)
            }
        }
        Kind::Bool => match text {
            "t" | "true" => raw("true"),
            "f" | "false" => raw("false"),
            other => string_value(other),
        },
        Kind::Json => match compact_json(text) {
            Some(compact) => raw(compact),
            None => string_value(text),
        },
        Kind::Bytea => match decode_bytea(text) {
            Some(bytes) => string_value(&base64::engine::general_purpose::STANDARD.encode(bytes)),
            None => string_value(text),
        },
        Kind::Timestamp => match parse_timestamp(text) {
            Some(ts) => string_value(&format_utc(&ts)),
            None => string_value(text),
        },
        Kind::Timestamptz => match parse_timestamptz(text) {
            Some(ts) => string_value(&format_utc(&ts.naive_utc())),
            None => string_value(text),
        },
        Kind::Date => match NaiveDate::parse_from_str(text, "%Y-%m-%d") {
            Ok(d) if is_plain_year(text) => string_value(&d.format("%Y-%m-%d").to_string()),
            _ => string_value(text),
        },
        Kind::Time => match NaiveTime::parse_from_str(text, "%H:%M:%S%.f") {
            Ok(t) => string_value(&format_time(&t)),
            Err(_) => string_value(text),
        },
        Kind::Timetz => match parse_timetz(text) {
            Some(s) => string_value(&s),
            None => string_value(text),
        },
        Kind::Array { elem, delim } => match parse_array(text, *delim) {
            Some(tree) => {
                let mut out = Vec::new();
                write_array(&tree, elem, &mut out);
                raw(String::from_utf8(out).expect("JSON written from UTF-8 text"))
            }
            None => string_value(text),
        },
        Kind::Text => string_value(text),
    }
}

/// Appends to `out` the JSON text [`to_json`] gives for `text`, without building a value
/// first for the common kinds (the baseline's hot path); the rest go through [`to_json`].
pub fn write_json(kind: &Kind, text: &str, out: &mut Vec<u8>) {
    match kind {
        Kind::Int | Kind::Numeric | Kind::Float if is_json_number(text) => {
            out.extend_from_slice(text.as_bytes())
        }
        Kind::Bool if matches!(text, "t" | "true") => out.extend_from_slice(b"true"),
        Kind::Bool if matches!(text, "f" | "false") => out.extend_from_slice(b"false"),
        Kind::Int | Kind::Numeric | Kind::Float | Kind::Bool | Kind::Text => {
            write_string(text, out)
        }
        Kind::Json => {
            if !write_compact_json(text, out) {
                write_string(text, out)
            }
        }
        // As `to_json`, without its value (an allocation, and a parse for `raw`).
        Kind::Bytea => match decode_bytea(text) {
            Some(bytes) => write_string(
                &base64::engine::general_purpose::STANDARD.encode(bytes),
                out,
            ),
            None => write_string(text, out),
        },
        // The timestamp's text is ASCII digits and separators: nothing to escape.
        Kind::Timestamptz => match parse_timestamptz(text) {
            Some(ts) => {
                out.push(b'"');
                write_utc(&ts.naive_utc(), out);
                out.push(b'"');
            }
            None => write_string(text, out),
        },
        Kind::Timestamp => match parse_timestamp(text) {
            Some(ts) => {
                out.push(b'"');
                write_utc(&ts, out);
                out.push(b'"');
            }
            None => write_string(text, out),
        },
        Kind::Array { elem, delim } => match parse_array(text, *delim) {
            Some(tree) => write_array(&tree, elem, out),
            None => write_string(text, out),
        },
        _ => out.extend_from_slice(to_json(kind, text).get().as_bytes()),
    }
}

/// A JSON string with serde_json's escaping (the same bytes as [`string_value`]).
pub fn write_string(s: &str, out: &mut Vec<u8>) {
    serde_json::to_writer(out, s).expect("writing to a Vec cannot fail");
}

/// Does `text` match the JSON number grammar exactly?
pub fn is_json_number(text: &str) -> bool {
    let b = text.as_bytes();
    let mut i = 0;
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(c) if c.is_ascii_digit() => {
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
        }
        _ => return false,
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return false;
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return false;
        }
    }
    i == b.len()
}

/// Validates JSON text and removes the whitespace outside strings, keeping every number and
/// string byte as written (no float round trip).
pub fn compact_json(text: &str) -> Option<String> {
    let mut out = Vec::with_capacity(text.len());
    write_compact_json(text, &mut out).then(|| String::from_utf8(out).expect("from a str"))
}

/// [`compact_json`] appended to `out`; false (nothing written) when `text` is not JSON.
pub fn write_compact_json(text: &str, out: &mut Vec<u8>) -> bool {
    if serde_json::from_str::<IgnoredAny>(text).is_err() {
        return false;
    }
    out.reserve(text.len());
    // Byte by byte: quotes, backslashes and whitespace are ASCII, never part of a multi-byte
    // character, so the text stays valid UTF-8.
    let mut in_string = false;
    let mut escaped = false;
    for &c in text.as_bytes() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == b'\\' {
                escaped = true;
            } else if c == b'"' {
                in_string = false;
            }
        } else if c == b'"' {
            in_string = true;
            out.push(c);
        } else if !matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
            out.push(c);
        }
    }
    true
}

/// Decodes bytea text output: hex (`\x0102`) or the legacy escape format.
pub fn decode_bytea(text: &str) -> Option<Vec<u8>> {
    if let Some(hex_digits) = text.strip_prefix("\\x") {
        return hex::decode(hex_digits).ok();
    }
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' {
            if b.get(i + 1) == Some(&b'\\') {
                out.push(b'\\');
                i += 2;
            } else {
                let oct = b.get(i + 1..i + 4)?;
                if !oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                    return None;
                }
                let v = (oct[0] - b'0') as u32 * 64
                    + (oct[1] - b'0') as u32 * 8
                    + (oct[2] - b'0') as u32;
                out.push(u8::try_from(v).ok()?);
                i += 4;
            }
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// Years outside 0001–9999 (and BC dates) cannot be written as RFC 3339; such values keep
/// PostgreSQL's text.
fn is_plain_year(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() >= 5 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' && !text.ends_with(" BC")
}

fn parse_timestamp(text: &str) -> Option<NaiveDateTime> {
    if !is_plain_year(text) {
        return None;
    }
    parse_iso_datetime(text)
}

/// `YYYY-MM-DD HH:MM:SS[.f…]` as PostgreSQL writes it (ISO DateStyle), parsed by hand — chrono's
/// format-string parser was a tenth of a baseline's CPU; anything else goes through it.
fn parse_iso_datetime(text: &str) -> Option<NaiveDateTime> {
    let b = text.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let s = b.get(r)?;
        s.iter()
            .all(u8::is_ascii_digit)
            .then(|| s.iter().fold(0u32, |n, d| n * 10 + u32::from(d - b'0')))
    };
    let fast = || -> Option<NaiveDateTime> {
        if b.len() < 19
            || b[4] != b'-'
            || b[7] != b'-'
            || b[10] != b' '
            || b[13] != b':'
            || b[16] != b':'
        {
            return None;
        }
        let micros = match b.get(19) {
            None => 0,
            Some(b'.') => {
                let digits = &b[20..];
                if digits.is_empty() || digits.len() > 9 || !digits.iter().all(u8::is_ascii_digit) {
                    return None;
                }
                let mut nanos = digits
                    .iter()
                    .fold(0u32, |n, d| n * 10 + u32::from(d - b'0'));
                for _ in digits.len()..9 {
                    nanos *= 10;
                }
                return NaiveDate::from_ymd_opt(num(0..4)? as i32, num(5..7)?, num(8..10)?)?
                    .and_hms_nano_opt(num(11..13)?, num(14..16)?, num(17..19)?, nanos);
            }
            Some(_) => return None,
        };
        NaiveDate::from_ymd_opt(num(0..4)? as i32, num(5..7)?, num(8..10)?)?.and_hms_nano_opt(
            num(11..13)?,
            num(14..16)?,
            num(17..19)?,
            micros,
        )
    };
    fast().or_else(|| NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f").ok())
}

/// Splits a trailing `±HH[:MM[:SS]]` offset off a time text; returns (rest, offset seconds).
fn split_offset(text: &str) -> Option<(&str, i32)> {
    // The offset starts at the last '+' or '-' after the time part.
    let pos = text.rfind(['+', '-'])?;
    let (rest, off) = text.split_at(pos);
    if !rest.contains(':') {
        return None;
    }
    let sign = if off.starts_with('-') { -1 } else { 1 };
    let mut parts = off[1..].split(':');
    let h: i32 = parts.next()?.parse().ok()?;
    let m: i32 = parts.next().map(str::parse).transpose().ok()?.unwrap_or(0);
    let s: i32 = parts.next().map(str::parse).transpose().ok()?.unwrap_or(0);
    Some((rest, sign * (h * 3600 + m * 60 + s)))
}

fn parse_timestamptz(text: &str) -> Option<DateTime<Utc>> {
    if !is_plain_year(text) {
        return None;
    }
    let (rest, offset) = split_offset(text)?;
    let naive = parse_iso_datetime(rest)?;
    let tz = FixedOffset::east_opt(offset)?;
    let local = naive.and_local_timezone(tz).single()?;
    let utc = local.with_timezone(&Utc);
    // Refuse results that RFC 3339 cannot carry (year outside 1..=9999 after conversion).
    if !(1..=9999).contains(&chrono::Datelike::year(&utc.naive_utc())) {
        return None;
    }
    Some(utc)
}

fn parse_timetz(text: &str) -> Option<String> {
    let (rest, offset) = split_offset(text)?;
    let t = NaiveTime::parse_from_str(rest, "%H:%M:%S%.f").ok()?;
    if offset % 60 != 0 {
        return None; // seconds in the offset: keep PostgreSQL's text
    }
    let sign = if offset < 0 { '-' } else { '+' };
    let a = offset.abs();
    Some(format!(
        "{}{}{:02}:{:02}",
        format_time(&t),
        sign,
        a / 3600,
        (a % 3600) / 60
    ))
}

/// `HH:MM:SS` plus the fraction with trailing zeros trimmed (as PostgreSQL prints it).
fn format_time(t: &NaiveTime) -> String {
    let mut s = t.format("%H:%M:%S%.6f").to_string();
    trim_fraction(&mut s);
    s
}

fn format_utc(ts: &NaiveDateTime) -> String {
    let mut out = Vec::with_capacity(27);
    write_utc(ts, &mut out);
    String::from_utf8(out).expect("ASCII")
}

/// `YYYY-MM-DDTHH:MM:SS[.ffffff]Z` appended to `out`, by hand: chrono's format strings were a
/// tenth of a baseline's CPU, and `write!` still showed.
fn write_utc(ts: &NaiveDateTime, out: &mut Vec<u8>) {
    use chrono::{Datelike, Timelike};
    let nanos = ts.nanosecond();
    if !(0..=9999).contains(&ts.year()) || nanos >= 1_000_000_000 {
        let mut s = ts.format("%Y-%m-%dT%H:%M:%S%.6f").to_string();
        trim_fraction(&mut s);
        s.push('Z');
        out.extend_from_slice(s.as_bytes());
        return;
    }
    let digits = |out: &mut Vec<u8>, n: u32, width: usize| {
        let mut buf = [b'0'; 6];
        let mut n = n;
        for d in buf[..width].iter_mut().rev() {
            *d = b'0' + (n % 10) as u8;
            n /= 10;
        }
        out.extend_from_slice(&buf[..width]);
    };
    digits(out, ts.year() as u32, 4);
    out.push(b'-');
    digits(out, ts.month(), 2);
    out.push(b'-');
    digits(out, ts.day(), 2);
    out.push(b'T');
    digits(out, ts.hour(), 2);
    out.push(b':');
    digits(out, ts.minute(), 2);
    out.push(b':');
    digits(out, ts.second(), 2);
    let micros = nanos / 1000;
    if micros > 0 {
        out.push(b'.');
        digits(out, micros, 6);
        while out.last() == Some(&b'0') {
            out.pop();
        }
    }
    out.push(b'Z');
}

fn trim_fraction(s: &mut String) {
    if s.contains('.') {
        while s.ends_with('0') {
            s.pop();
        }
        if s.ends_with('.') {
            s.pop();
        }
    }
}

/// A parsed array literal: nested lists of optional element texts (`None` = NULL).
#[derive(Debug, PartialEq, Eq)]
pub enum ArrayNode {
    List(Vec<ArrayNode>),
    Elem(Option<String>),
}

/// Parses PostgreSQL array output (`{1,2}`, `{{"a b",NULL},{c,"\"d\""}}`, `[0:1]={1,2}`).
pub fn parse_array(text: &str, delim: u8) -> Option<ArrayNode> {
    let mut s = text.as_bytes();
    if s.first() == Some(&b'[') {
        // Explicit bounds: `[lo:hi][lo:hi]={...}`.
        let eq = s.iter().position(|&c| c == b'=')?;
        s = &s[eq + 1..];
    }
    let mut pos = 0;
    let node = parse_list(s, &mut pos, delim)?;
    skip_ws(s, &mut pos);
    (pos == s.len()).then_some(node)
}

fn skip_ws(s: &[u8], pos: &mut usize) {
    while s.get(*pos).is_some_and(|c| c.is_ascii_whitespace()) {
        *pos += 1;
    }
}

fn parse_list(s: &[u8], pos: &mut usize, delim: u8) -> Option<ArrayNode> {
    skip_ws(s, pos);
    if s.get(*pos) != Some(&b'{') {
        return None;
    }
    *pos += 1;
    let mut items = Vec::new();
    skip_ws(s, pos);
    if s.get(*pos) == Some(&b'}') {
        *pos += 1;
        return Some(ArrayNode::List(items));
    }
    loop {
        skip_ws(s, pos);
        match s.get(*pos)? {
            b'{' => items.push(parse_list(s, pos, delim)?),
            b'"' => {
                *pos += 1;
                let mut buf = Vec::new();
                loop {
                    match *s.get(*pos)? {
                        b'\\' => {
                            buf.push(*s.get(*pos + 1)?);
                            *pos += 2;
                        }
                        b'"' => {
                            *pos += 1;
                            break;
                        }
                        c => {
                            buf.push(c);
                            *pos += 1;
                        }
                    }
                }
                items.push(ArrayNode::Elem(Some(String::from_utf8(buf).ok()?)));
            }
            _ => {
                let start = *pos;
                let mut buf = Vec::new();
                while let Some(&c) = s.get(*pos) {
                    if c == delim || c == b'}' {
                        break;
                    }
                    if c == b'\\' {
                        buf.push(*s.get(*pos + 1)?);
                        *pos += 2;
                        continue;
                    }
                    buf.push(c);
                    *pos += 1;
                }
                if *pos == start {
                    return None;
                }
                let mut text = String::from_utf8(buf).ok()?;
                text.truncate(text.trim_end().len());
                if text.eq_ignore_ascii_case("NULL") {
                    items.push(ArrayNode::Elem(None));
                } else {
                    items.push(ArrayNode::Elem(Some(text)));
                }
            }
        }
        skip_ws(s, pos);
        match *s.get(*pos)? {
            c if c == delim => *pos += 1,
            b'}' => {
                *pos += 1;
                return Some(ArrayNode::List(items));
            }
            _ => return None,
        }
    }
}

/// An array's JSON appended to `out`, element by element (no string per element).
fn write_array(node: &ArrayNode, elem: &Kind, out: &mut Vec<u8>) {
    match node {
        ArrayNode::Elem(None) => out.extend_from_slice(b"null"),
        ArrayNode::Elem(Some(text)) => write_json(elem, text, out),
        ArrayNode::List(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_array(item, elem, out);
            }
            out.push(b']');
        }
    }
}

#[cfg(test)]
mod tests;
