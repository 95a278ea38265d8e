//! Row identity (rule R4) and laredo's stored key string (rule W2).

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::model::Change;
use super::value::{Row, canonical_text};

/// Identity of a row: the canonical texts of its key values. One key field: the text itself;
/// several: a JSON array of the texts (unambiguous, unlike laredo's space-joined form).
pub type Identity = Box<str>;

/// Builds an identity from the key fields' values; `None` when a key field is missing.
pub fn identity_of(values: &[Option<&RawValue>]) -> Option<Identity> {
    if values.len() == 1 {
        return values[0].map(|v| canonical_text(v).into_owned().into_boxed_str());
    }
    let mut texts = Vec::with_capacity(values.len());
    for v in values {
        texts.push(canonical_text((*v)?).into_owned());
    }
    Some(
        serde_json::to_string(&texts)
            .expect("strings serialize")
            .into_boxed_str(),
    )
}

/// Identity of a row, parsing only what is needed.
pub fn row_identity(row: &Row, key_fields: &[String]) -> Option<Identity> {
    let fields: BTreeMap<Cow<'_, str>, &RawValue> = row.fields().ok()?;
    let values: Vec<Option<&RawValue>> = key_fields
        .iter()
        .map(|k| fields.get(k.as_str()).copied())
        .collect();
    identity_of(&values)
}

/// Identity of an archived change: from `new` (insert, update) or `old` (delete), falling
/// back to the stored key string only when those lack the key fields.
pub fn change_identity(change: &Change, key_fields: &[String]) -> Identity {
    let from_row = match change.action {
        super::model::Action::Delete => change.old.as_ref().or(change.new.as_ref()),
        _ => change.new.as_ref().or(change.old.as_ref()),
    };
    from_row
        .and_then(|r| row_identity(r, key_fields))
        .unwrap_or_else(|| stored_key_identity(&change.key, key_fields.len()))
}

/// Interprets laredo's stored key string as an identity (best effort: single keys only are
/// unambiguous; `<nil>` means "no key").
pub fn stored_key_identity(key: &str, n_fields: usize) -> Identity {
    if n_fields == 1 {
        let v = crate::value::string_value(key);
        return canonical_text(&v).into_owned().into_boxed_str();
    }
    let inner = key
        .strip_prefix('[')
        .and_then(|k| k.strip_suffix(']'))
        .unwrap_or(key);
    let parts: Vec<String> = inner
        .split(' ')
        .map(|p| canonical_text(&crate::value::string_value(p)).into_owned())
        .collect();
    serde_json::to_string(&parts)
        .expect("strings serialize")
        .into_boxed_str()
}

/// A single-pass visitor over a JSON object that validates it and captures the raw values of
/// the key fields (the hot path of snapshot decoding).
pub struct KeyCapture<'k, 'de> {
    pub key_fields: &'k [String],
    pub values: Vec<Option<&'de RawValue>>,
}

impl<'k, 'de> KeyCapture<'k, 'de> {
    pub fn new(key_fields: &'k [String]) -> Self {
        KeyCapture {
            key_fields,
            values: vec![None; key_fields.len()],
        }
    }

    /// Validates `text` as one JSON object and returns the key values.
    pub fn scan(
        key_fields: &'k [String],
        text: &'de str,
    ) -> Result<Vec<Option<&'de RawValue>>, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_str(text);
        let values = KeyCapture::new(key_fields).deserialize(&mut de)?;
        de.end()?;
        Ok(values)
    }
}

impl<'k, 'de> DeserializeSeed<'de> for KeyCapture<'k, 'de> {
    type Value = Vec<Option<&'de RawValue>>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'k, 'de> Visitor<'de> for KeyCapture<'k, 'de> {
    type Value = Vec<Option<&'de RawValue>>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object (one row)")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Self::Value, A::Error> {
        if self.key_fields.is_empty() {
            // validation only: no field name is needed
            while map.next_key::<IgnoredAny>()?.is_some() {
                map.next_value::<IgnoredAny>()?;
            }
            return Ok(self.values);
        }
        while let Some(key) = map.next_key_seed(FieldName)? {
            match self
                .key_fields
                .iter()
                .position(|k| k.as_str() == key.as_ref())
            {
                Some(i) => self.values[i] = Some(map.next_value::<&'de RawValue>()?),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(self.values)
    }
}

/// A field name, borrowed from the row's text unless it holds an escape (serde's `Cow<str>`
/// always allocates: one allocation per field per row on the decoding hot path).
struct FieldName;

impl<'de> DeserializeSeed<'de> for FieldName {
    type Value = Cow<'de, str>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for FieldName {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a field name")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_string()))
    }
}

/// laredo's RowKey for a row (W2): Go's `%v` of the key values *as laredo's reader decodes
/// them* (JSON numbers as float64), composite keys as `[a b]`.
pub fn laredo_row_key(row: Option<&Row>, key_fields: &[String]) -> String {
    let fields: BTreeMap<Cow<'_, str>, &RawValue> =
        row.and_then(|r| r.fields().ok()).unwrap_or_default();
    let render = |f: &String| match fields.get(f.as_str()) {
        Some(v) => go_v(v),
        None => "<nil>".to_string(),
    };
    if key_fields.len() == 1 {
        render(&key_fields[0])
    } else {
        let parts: Vec<String> = key_fields.iter().map(render).collect();
        format!("[{}]", parts.join(" "))
    }
}

/// Go's `%v` of a JSON value decoded by `encoding/json` into `any`.
pub fn go_v(value: &RawValue) -> String {
    let text = value.get().trim();
    match text.as_bytes().first() {
        Some(b'"') => serde_json::from_str::<String>(text).unwrap_or_else(|_| text.to_string()),
        Some(b'n') => "<nil>".to_string(),
        Some(b't' | b'f') => text.to_string(),
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_str(text).unwrap_or_default();
            format!(
                "[{}]",
                items.iter().map(|v| go_v(v)).collect::<Vec<_>>().join(" ")
            )
        }
        Some(b'{') => {
            let items: BTreeMap<String, &RawValue> = serde_json::from_str(text).unwrap_or_default();
            let parts: Vec<String> = items
                .iter()
                .map(|(k, v)| format!("{k}:{}", go_v(v)))
                .collect();
            format!("map[{}]", parts.join(" "))
        }
        _ => match text.parse::<f64>() {
            Ok(f) => go_float(f),
            Err(_) => text.to_string(),
        },
    }
}

/// strconv.FormatFloat(f, 'g', -1, 64): shortest digits; exponent form when the decimal
/// exponent is < -4 or >= 6 (Go's `%v` for float64).
pub fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "+Inf".to_string()
        } else {
            "-Inf".to_string()
        };
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0".to_string()
        } else {
            "0".to_string()
        };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: `1.234567e6`.
    let e = format!("{f:e}");
    let (mantissa, exp) = e.split_once('e').expect("exponent form");
    let exp: i32 = exp.parse().expect("exponent");
    let neg = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if neg { "-" } else { "" };
    if !(-4..6).contains(&exp) {
        let mut m = digits[..1].to_string();
        if digits.len() > 1 {
            m.push('.');
            m.push_str(&digits[1..]);
        }
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{m}e{esign}{:02}", exp.abs());
    }
    // Fixed notation.
    let point = exp + 1; // digits before the decimal point
    let out = if point <= 0 {
        format!("0.{}{}", "0".repeat((-point) as usize), digits)
    } else if (point as usize) >= digits.len() {
        format!("{}{}", digits, "0".repeat(point as usize - digits.len()))
    } else {
        format!(
            "{}.{}",
            &digits[..point as usize],
            &digits[point as usize..]
        )
    };
    format!("{sign}{out}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::raw;

    #[test]
    fn go_float_matches_strconv() {
        assert_eq!(go_float(1.0), "1");
        assert_eq!(go_float(123456.0), "123456");
        assert_eq!(go_float(1234567.0), "1.234567e+06");
        assert_eq!(go_float(1e21), "1e+21");
        assert_eq!(go_float(0.00001), "1e-05");
        assert_eq!(go_float(0.0001), "0.0001");
        assert_eq!(go_float(1.5), "1.5");
        assert_eq!(go_float(-2.25), "-2.25");
        assert_eq!(go_float(100000.0), "100000");
        assert_eq!(go_float(1000000.0), "1e+06");
    }

    #[test]
    fn laredo_keys() {
        let row = Row::parse(r#"{"id": 1234567, "t": "a b", "n": null}"#).unwrap();
        assert_eq!(laredo_row_key(Some(&row), &["id".into()]), "1.234567e+06");
        assert_eq!(
            laredo_row_key(Some(&row), &["t".into(), "id".into()]),
            "[a b 1.234567e+06]"
        );
        assert_eq!(laredo_row_key(Some(&row), &["missing".into()]), "<nil>");
        assert_eq!(
            laredo_row_key(None, &["a".into(), "b".into()]),
            "[<nil> <nil>]"
        );
        assert_eq!(
            go_v(&raw(r#"{"b":[1,"x"],"a":true}"#)),
            "map[a:true b:[1 x]]"
        );
    }

    #[test]
    fn identities_unify_spellings() {
        let a = Row::parse(r#"{"id": 1234567}"#).unwrap();
        let b = Row::parse(r#"{"id": "1234567"}"#).unwrap();
        let c = Row::parse(r#"{"id": 1.234567e6}"#).unwrap();
        let k = vec!["id".to_string()];
        assert_eq!(row_identity(&a, &k), row_identity(&b, &k));
        assert_eq!(row_identity(&a, &k), row_identity(&c, &k));
        assert_eq!(
            stored_key_identity("1.234567e+06", 1),
            row_identity(&a, &k).unwrap()
        );
        let two = vec!["t".to_string(), "id".to_string()];
        let r = Row::parse(r#"{"t": "a b", "id": 1}"#).unwrap();
        assert_eq!(row_identity(&r, &two).unwrap().as_ref(), r#"["a b","1"]"#);
    }

    #[test]
    fn key_capture_validates_whole_object() {
        let k = vec!["id".to_string()];
        let v = KeyCapture::scan(&k, r#"{"a":[1,{"x":2}],"id":7}"#).unwrap();
        assert_eq!(v[0].unwrap().get(), "7");
        assert!(KeyCapture::scan(&k, r#"{"id":7"#).is_err());
        assert!(KeyCapture::scan(&k, r#"[1]"#).is_err());
        assert!(KeyCapture::scan(&k, r#"{"id":7} x"#).is_err());
        // an escaped field name still matches; no key fields still validates the whole object
        let v = KeyCapture::scan(&k, r#"{"\u0069d":"x"}"#).unwrap();
        assert_eq!(v[0].unwrap().get(), r#""x""#);
        assert!(
            KeyCapture::scan(&[], r#"{"a":[1,{"x":2}],"id":7}"#)
                .unwrap()
                .is_empty()
        );
        assert!(KeyCapture::scan(&[], r#"{"id":7"#).is_err());
        assert!(KeyCapture::scan(&[], r#"[1]"#).is_err());
        assert!(KeyCapture::scan(&[], r#"{"a":tru}"#).is_err());
    }
}
