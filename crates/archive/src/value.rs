//! Rows and values. A value is kept as its exact JSON text, so every digit of every number
//! survives a round trip (rule R6); a row is a JSON object stored compactly as one string.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// One column value: exact JSON text.
pub type Value = Box<RawValue>;

/// A row as an ordered map (keys sorted, as laredo writes them).
pub type RowMap = BTreeMap<String, Value>;

/// A row: a JSON object kept as its text (valid by construction). Cheap to store, clone and
/// emit: the hot paths never re-encode it.
#[derive(Clone)]
pub struct Row(Box<str>);

impl Row {
    /// Parses and validates a JSON object. The text is re-encoded compactly with sorted keys.
    pub fn parse(text: &str) -> Result<Row, serde_json::Error> {
        let map: BTreeMap<Cow<'_, str>, &RawValue> = serde_json::from_str(text)?;
        Ok(Row::from_borrowed(&map))
    }

    /// Wraps text that a decoder has already validated as one JSON object.
    pub fn from_validated(text: &str) -> Row {
        debug_assert!(text.trim_start().starts_with('{'));
        Row(text.into())
    }

    pub fn from_map(map: &RowMap) -> Row {
        Row(serde_json::to_string(map)
            .expect("a map of raw values always serializes")
            .into_boxed_str())
    }

    pub(crate) fn from_borrowed(map: &BTreeMap<Cow<'_, str>, &RawValue>) -> Row {
        Row(serde_json::to_string(map)
            .expect("a map of raw values always serializes")
            .into_boxed_str())
    }

    pub fn empty() -> Row {
        Row("{}".into())
    }

    /// The JSON text of the row.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.fields().map(|m| m.is_empty()).unwrap_or(true)
    }

    /// Borrowed view of the fields.
    pub fn fields(&self) -> Result<BTreeMap<Cow<'_, str>, &RawValue>, serde_json::Error> {
        serde_json::from_str(&self.0)
    }

    /// The fields in key order, names borrowed unless escaped: what a pass over every field
    /// needs, without a map to build (a row's keys are sorted already; others are sorted
    /// here, the last of a repeated key kept, as [`Self::fields`] does).
    pub fn field_list(&self) -> Result<Vec<(Cow<'_, str>, &RawValue)>, serde_json::Error> {
        let FieldList(mut list) = serde_json::from_str(&self.0)?;
        if !list.windows(2).all(|w| w[0].0 < w[1].0) {
            let sorted: BTreeMap<_, _> = list.into_iter().collect();
            list = sorted.into_iter().collect();
        }
        Ok(list)
    }

    /// A row from fields in key order with compact values, written as [`Self::parse`] would
    /// re-encode them.
    pub fn from_sorted_fields<'a>(fields: impl IntoIterator<Item = (&'a str, &'a str)>) -> Row {
        let mut text = String::from("{");
        for (name, value) in fields {
            if text.len() > 1 {
                text.push(',');
            }
            if name.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
                text.push('"');
                text.push_str(name);
                text.push('"');
            } else {
                text.push_str(&serde_json::to_string(name).expect("a string always serializes"));
            }
            text.push(':');
            text.push_str(value);
        }
        text.push('}');
        Row(text.into_boxed_str())
    }

    pub fn to_map(&self) -> RowMap {
        serde_json::from_str(&self.0).expect("a row is always a JSON object")
    }

    /// The value of one field, if present.
    pub fn get(&self, field: &str) -> Option<Value> {
        let fields = self.fields().ok()?;
        fields.get(field).map(|v| (*v).to_owned())
    }

    /// Field names in sorted order.
    pub fn field_names(&self) -> Vec<String> {
        self.fields()
            .map(|m| m.keys().map(|k| k.to_string()).collect())
            .unwrap_or_default()
    }

    /// Structural equality with numbers compared by value.
    pub fn same_values(&self, other: &Row) -> bool {
        match (
            RawValue::from_string(self.0.to_string()),
            RawValue::from_string(other.0.to_string()),
        ) {
            (Ok(a), Ok(b)) => values_equal(&a, &b),
            _ => false,
        }
    }
}

/// A JSON object's fields in their order ([`Row::field_list`]).
struct FieldList<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

/// A field name borrowed from the text unless it has escapes (serde's `Cow<str>` always owns).
struct FieldName<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for FieldName<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Name;
        impl<'de> serde::de::Visitor<'de> for Name {
            type Value = FieldName<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(FieldName(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(FieldName(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(Name)
    }
}

impl<'de> Deserialize<'de> for FieldList<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = FieldList<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut list = Vec::with_capacity(map.size_hint().unwrap_or(16));
                while let Some((FieldName(name), value)) = map.next_entry()? {
                    list.push((name, value));
                }
                Ok(FieldList(list))
            }
        }
        d.deserialize_map(Fields)
    }
}

impl Serialize for Row {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let raw = RawValue::from_string(self.0.to_string()).map_err(serde::ser::Error::custom)?;
        raw.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Row {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Row, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        if !raw.get().trim_start().starts_with('{') {
            return Err(serde::de::Error::custom("a row must be a JSON object"));
        }
        Ok(Row(raw.get().into()))
    }
}

impl fmt::Debug for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq for Row {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}
impl Eq for Row {}

/// Builds a raw JSON value from text that is known to be valid JSON.
pub fn raw(text: impl Into<String>) -> Value {
    RawValue::from_string(text.into()).expect("valid JSON value")
}

/// A JSON string value.
pub fn string_value(s: &str) -> Value {
    serde_json::value::to_raw_value(s).expect("a string always serializes")
}

/// The canonical text of a value for identity (rule R4): a JSON number by its exact decimal
/// value (integral values as plain integers, `1.234567e+06` = `1234567`), a string as itself,
/// anything else as its compact JSON text.
pub fn canonical_text(value: &RawValue) -> Cow<'_, str> {
    canonical_text_of(value.get())
}

/// [`canonical_text`] of a value's JSON text (already validated, as stored rows hold it).
pub fn canonical_text_of(text: &str) -> Cow<'_, str> {
    let text = text.trim();
    match text.as_bytes().first() {
        Some(b'"') => match serde_json::from_str::<Cow<'_, str>>(text) {
            Ok(s) => canonical_string(s),
            Err(_) => Cow::Borrowed(text),
        },
        Some(b'-' | b'0'..=b'9') => Cow::Owned(canonical_number(text)),
        _ => Cow::Borrowed(text),
    }
}

fn canonical_string(s: Cow<'_, str>) -> Cow<'_, str> {
    // A numeric string names the same key value as the number with the same text.
    if looks_numeric(&s) {
        Cow::Owned(canonical_number(&s))
    } else {
        s
    }
}

fn looks_numeric(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && (b[0] == b'-' || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_digit() || matches!(c, b'-' | b'+' | b'.' | b'e' | b'E'))
        && parse_decimal(s).is_some()
}

/// Canonical decimal text of a JSON number literal: no exponent, no trailing fractional zeros,
/// no leading zeros, `-0` as `0`. Returns the input unchanged if it is not a number.
pub fn canonical_number(text: &str) -> String {
    match parse_decimal(text) {
        Some((neg, digits, exp)) => render_decimal(neg, &digits, exp),
        None => text.to_string(),
    }
}

/// Parses a decimal literal into (negative, significant digits without leading zeros, exponent)
/// so that value = digits × 10^exp.
fn parse_decimal(text: &str) -> Option<(bool, String, i64)> {
    let mut s = text;
    let mut neg = false;
    if let Some(rest) = s.strip_prefix('-') {
        neg = true;
        s = rest;
    } else if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    }
    let (mantissa, exp_part) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let mut exp: i64 = match exp_part {
        Some(e) => e.parse().ok()?,
        None => 0,
    };
    let (int_part, frac_part) = match mantissa.find('.') {
        Some(i) => (&mantissa[..i], &mantissa[i + 1..]),
        None => (mantissa, ""),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    if !int_part.bytes().all(|c| c.is_ascii_digit())
        || !frac_part.bytes().all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let mut digits = String::with_capacity(int_part.len() + frac_part.len());
    digits.push_str(int_part);
    digits.push_str(frac_part);
    exp -= frac_part.len() as i64;
    let trimmed = digits.trim_start_matches('0');
    let mut digits = trimmed.to_string();
    while digits.ends_with('0') {
        digits.pop();
        exp += 1;
    }
    if digits.is_empty() {
        return Some((false, "0".to_string(), 0));
    }
    Some((neg, digits, exp))
}

fn render_decimal(neg: bool, digits: &str, exp: i64) -> String {
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    if exp >= 0 {
        out.push_str(digits);
        for _ in 0..exp {
            out.push('0');
        }
    } else {
        let frac_len = (-exp) as usize;
        if digits.len() > frac_len {
            let (i, f) = digits.split_at(digits.len() - frac_len);
            out.push_str(i);
            out.push('.');
            out.push_str(f);
        } else {
            out.push_str("0.");
            for _ in 0..(frac_len - digits.len()) {
                out.push('0');
            }
            out.push_str(digits);
        }
    }
    out
}

/// Compares two JSON values for equality the way fixtures and tests need: numbers by exact
/// decimal value, everything else structurally.
pub fn values_equal(a: &RawValue, b: &RawValue) -> bool {
    let (a, b) = (a.get().trim(), b.get().trim());
    let num = |s: &str| matches!(s.as_bytes().first(), Some(b'-' | b'0'..=b'9'));
    if num(a) && num(b) {
        return canonical_number(a) == canonical_number(b);
    }
    match (a.as_bytes().first(), b.as_bytes().first()) {
        (Some(b'{'), Some(b'{')) => {
            let (Ok(ma), Ok(mb)) = (
                serde_json::from_str::<BTreeMap<Cow<'_, str>, &RawValue>>(a),
                serde_json::from_str::<BTreeMap<Cow<'_, str>, &RawValue>>(b),
            ) else {
                return false;
            };
            ma.len() == mb.len()
                && ma
                    .iter()
                    .all(|(k, va)| mb.get(k).is_some_and(|vb| values_equal(va, vb)))
        }
        (Some(b'['), Some(b'[')) => {
            let (Ok(la), Ok(lb)) = (
                serde_json::from_str::<Vec<&RawValue>>(a),
                serde_json::from_str::<Vec<&RawValue>>(b),
            ) else {
                return false;
            };
            la.len() == lb.len() && la.iter().zip(lb.iter()).all(|(x, y)| values_equal(x, y))
        }
        (Some(b'"'), Some(b'"')) => {
            serde_json::from_str::<Cow<'_, str>>(a).ok()
                == serde_json::from_str::<Cow<'_, str>>(b).ok()
        }
        _ => a == b,
    }
}

/// Orders canonical key texts: numbers numerically, otherwise by text.
pub fn compare_canonical(a: &str, b: &str) -> Ordering {
    match (parse_decimal(a), parse_decimal(b)) {
        (Some(x), Some(y)) if looks_numeric(a) && looks_numeric(b) => compare_decimal(&x, &y),
        _ => a.cmp(b),
    }
}

fn compare_decimal(a: &(bool, String, i64), b: &(bool, String, i64)) -> Ordering {
    let zero = |d: &(bool, String, i64)| d.1 == "0";
    let sign = |d: &(bool, String, i64)| {
        if zero(d) {
            0
        } else if d.0 {
            -1
        } else {
            1
        }
    };
    let (sa, sb) = (sign(a), sign(b));
    if sa != sb {
        return sa.cmp(&sb);
    }
    if sa == 0 {
        return Ordering::Equal;
    }
    // Same sign: compare magnitudes by order of magnitude, then digit by digit.
    let mag = |d: &(bool, String, i64)| d.1.len() as i64 + d.2;
    let ord = mag(a).cmp(&mag(b)).then_with(|| {
        let (da, db) = (a.1.as_bytes(), b.1.as_bytes());
        for i in 0..da.len().max(db.len()) {
            let x = da.get(i).copied().unwrap_or(b'0');
            let y = db.get(i).copied().unwrap_or(b'0');
            if x != y {
                return x.cmp(&y);
            }
        }
        Ordering::Equal
    });
    if sa < 0 { ord.reverse() } else { ord }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_lists_come_in_key_order_and_rebuild_what_parse_writes() {
        for text in [
            r#"{"a":1,"b":{"x":[1,2]},"c":null}"#,
            r#"{"c":null,"a":1,"b":"two"}"#,
            r#"{"b":1,"a":2,"b":3}"#,
            r#"{"qu\"ote":1,"tab\tkey":"v","\u00e9":2}"#,
            "{}",
        ] {
            let row = Row::from_validated(text);
            let list = row.field_list().unwrap();
            let names: Vec<&str> = list.iter().map(|(n, _)| n.as_ref()).collect();
            let mut sorted = names.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(names, sorted, "{text}");
            let rebuilt = Row::from_sorted_fields(list.iter().map(|(n, v)| (n.as_ref(), v.get())));
            assert_eq!(rebuilt, Row::parse(text).unwrap(), "{text}");
        }
        // Plain names are borrowed from the row's text, escaped ones decoded.
        let row = Row::from_validated(r#"{"id":1,"na\"me":2}"#);
        let list = row.field_list().unwrap();
        assert!(matches!(list[0].0, Cow::Borrowed("id")));
        assert_eq!(list[1].0, "na\"me");
        assert!(Row("[1]".into()).field_list().is_err());
    }

    #[test]
    fn canonical_numbers() {
        assert_eq!(canonical_number("1.234567e+06"), "1234567");
        assert_eq!(canonical_number("1234567"), "1234567");
        assert_eq!(canonical_number("1.0"), "1");
        assert_eq!(canonical_number("-0.0"), "0");
        assert_eq!(canonical_number("0.00001"), "0.00001");
        assert_eq!(canonical_number("1e-05"), "0.00001");
        assert_eq!(canonical_number("123.450"), "123.45");
        assert_eq!(canonical_number("9007199254740993"), "9007199254740993");
        assert_eq!(
            canonical_number("12345678901234567890.123"),
            "12345678901234567890.123"
        );
        assert_eq!(canonical_number("1e21"), "1000000000000000000000");
    }

    #[test]
    fn canonical_text_unifies_numbers_and_numeric_strings() {
        assert_eq!(canonical_text(&raw("1.234567e+06")), "1234567");
        assert_eq!(canonical_text(&raw("\"1234567\"")), "1234567");
        assert_eq!(canonical_text(&raw("\"abc\"")), "abc");
        assert_eq!(canonical_text(&raw("true")), "true");
    }

    #[test]
    fn rows_keep_every_digit() {
        let row = Row::parse(r#"{"b": 12345678901234567890.123, "a": 9007199254740993}"#).unwrap();
        assert_eq!(
            row.as_str(),
            r#"{"a":9007199254740993,"b":12345678901234567890.123}"#
        );
        assert_eq!(row.get("a").unwrap().get(), "9007199254740993");
    }

    #[test]
    fn values_compare_numbers_by_value() {
        assert!(values_equal(&raw("1.0"), &raw("1")));
        assert!(values_equal(&raw(r#"{"n":3.0}"#), &raw(r#"{"n": 3}"#)));
        assert!(!values_equal(&raw("1"), &raw("\"1\"")));
    }

    #[test]
    fn canonical_order_is_numeric() {
        assert_eq!(compare_canonical("10", "9"), Ordering::Greater);
        assert_eq!(compare_canonical("-10", "-9"), Ordering::Less);
        assert_eq!(compare_canonical("1.5", "1.25"), Ordering::Greater);
        assert_eq!(compare_canonical("a", "b"), Ordering::Less);
    }
}
