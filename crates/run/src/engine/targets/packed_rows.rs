//! Compact row storage for the memory target: one buffer per row, without its field names.
//!
//! A row's text is cut at its top-level values: what lies between them (`{"amount":`,
//! `,"blob":`, …, `}`, whitespace included) is the row's *shape*, kept once per table and
//! shared by every row of that shape. A row is stored as its shape number and its values'
//! bytes, each after its length (LEB128). Putting shape and values back together gives the
//! row's exact text, byte for byte. Rows that do not parse, and rows of new shapes once a table
//! has [`MAX_SHAPES`], are stored as their whole text (shape 0).
//!
//! The shape also knows which value holds each key and index field, so a stored row's identity
//! and index values are read without parsing it again (an update unindexes the row it
//! replaces).

use std::borrow::Cow;
use std::collections::HashMap;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

/// Distinct shapes one table keeps (a table has one per schema and key order, a handful).
/// Past it, rows of further shapes are stored whole: memory stays bounded by the rows.
pub const MAX_SHAPES: usize = 4096;

/// One stored row.
pub struct PackedRow(Box<[u8]>);

impl PackedRow {
    /// Bytes this row holds (its buffer, not counting the allocator's rounding).
    pub fn stored_len(&self) -> usize {
        self.0.len()
    }
}

struct Shape {
    /// The text around the values: one more segment than values.
    segments: Box<[Box<str>]>,
    /// For each scan field (key fields then index fields), the value holding it (the last one
    /// when a key repeats, as the parsers of the archive read it).
    scan_slots: Box<[Option<u32>]>,
}

/// The shapes of one table, and the fields whose values its rows are asked for.
pub struct Shapes {
    scan_fields: Vec<String>,
    shapes: Vec<Shape>,
    /// Segments joined by NUL (a byte valid JSON never holds outside a value) → shape number.
    by_text: HashMap<Box<str>, u32>,
}

/// A row parsed once: its top-level values in order, and the scan fields' values.
pub struct Scanned<'a> {
    text: &'a str,
    values: Vec<&'a RawValue>,
    /// One per scan field.
    pub fields: Vec<Option<&'a RawValue>>,
}

/// Parses `text` as one JSON object (validating it), capturing every top-level value.
pub fn scan<'a>(scan_fields: &[String], text: &'a str) -> Result<Scanned<'a>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let (values, fields) = Capture { scan_fields }.deserialize(&mut de)?;
    de.end()?;
    Ok(Scanned {
        text,
        values,
        fields,
    })
}

struct Capture<'k> {
    scan_fields: &'k [String],
}

type Captured<'de> = (Vec<&'de RawValue>, Vec<Option<&'de RawValue>>);

impl<'de> DeserializeSeed<'de> for Capture<'_> {
    type Value = Captured<'de>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Capture<'_> {
    type Value = Captured<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object (one row)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut values = Vec::with_capacity(map.size_hint().unwrap_or(16));
        let mut fields = vec![None; self.scan_fields.len()];
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            let v: &'de RawValue = map.next_value()?;
            if let Some(i) = self.scan_fields.iter().position(|f| *f == key) {
                fields[i] = Some(v);
            }
            values.push(v);
        }
        Ok((values, fields))
    }
}

/// Scans the values a stored whole row holds for the scan fields (no values kept).
fn scan_whole<'a>(scan_fields: &[String], text: &'a str) -> Vec<Option<&'a RawValue>> {
    struct Fields<'k>(&'k [String]);
    impl<'de> Visitor<'de> for Fields<'_> {
        type Value = Vec<Option<&'de RawValue>>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object (one row)")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut fields = vec![None; self.0.len()];
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                match self.0.iter().position(|f| *f == key) {
                    Some(i) => fields[i] = Some(map.next_value()?),
                    None => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(fields)
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    serde::Deserializer::deserialize_map(&mut de, Fields(scan_fields))
        .unwrap_or_else(|_| vec![None; scan_fields.len()])
}

fn push_len(out: &mut Vec<u8>, mut n: usize) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn read_len(bytes: &[u8], at: &mut usize) -> usize {
    let mut n = 0usize;
    let mut shift = 0;
    loop {
        let b = bytes[*at];
        *at += 1;
        n |= ((b & 0x7f) as usize) << shift;
        if b < 0x80 {
            return n;
        }
        shift += 7;
    }
}

/// Every byte of a packed row after its header comes from a `str` cut at ASCII delimiters.
fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).expect("packed from a str at char boundaries")
}

impl Shapes {
    pub fn new(scan_fields: Vec<String>) -> Shapes {
        Shapes {
            scan_fields,
            shapes: Vec::new(),
            by_text: HashMap::new(),
        }
    }

    pub fn scan_fields(&self) -> &[String] {
        &self.scan_fields
    }

    /// Stores a row that did not parse (or is to be kept whole) as its text.
    pub fn pack_whole(text: &str) -> PackedRow {
        let mut out = Vec::with_capacity(text.len() + 1);
        push_len(&mut out, 0);
        out.extend_from_slice(text.as_bytes());
        PackedRow(out.into_boxed_slice())
    }

    /// Stores a scanned row.
    pub fn pack(&mut self, row: &Scanned<'_>) -> PackedRow {
        let base = row.text.as_ptr() as usize;
        let mut key = String::with_capacity(128);
        let mut cuts: Vec<(usize, usize)> = Vec::with_capacity(row.values.len());
        let mut at = 0;
        for v in &row.values {
            let start = v.get().as_ptr() as usize - base;
            let end = start + v.get().len();
            if start < at || end > row.text.len() {
                // Not slices of this text in order (never from serde_json's borrowing parser).
                return Shapes::pack_whole(row.text);
            }
            key.push_str(&row.text[at..start]);
            key.push('\0');
            cuts.push((start, end));
            at = end;
        }
        key.push_str(&row.text[at..]);
        let id = match self.by_text.get(key.as_str()) {
            Some(id) => *id,
            None if self.shapes.len() >= MAX_SHAPES => return Shapes::pack_whole(row.text),
            None => self.add_shape(key),
        };
        let values_len: usize = cuts.iter().map(|(s, e)| e - s + 2).sum();
        let mut out = Vec::with_capacity(values_len + 3);
        push_len(&mut out, id as usize + 1);
        for (s, e) in cuts {
            push_len(&mut out, e - s);
            out.extend_from_slice(&row.text.as_bytes()[s..e]);
        }
        PackedRow(out.into_boxed_slice())
    }

    fn add_shape(&mut self, key: String) -> u32 {
        let segments: Box<[Box<str>]> = key.split('\0').map(Box::from).collect();
        let mut scan_slots = vec![None; self.scan_fields.len()];
        for (slot, seg) in segments[..segments.len() - 1].iter().enumerate() {
            // A segment ends with the value's key and its colon: `…"name":` (whitespace too).
            let Some(name) = segment_key(seg) else {
                continue;
            };
            if let Some(i) = self.scan_fields.iter().position(|f| *f == name) {
                scan_slots[i] = Some(slot as u32);
            }
        }
        let id = self.shapes.len() as u32;
        self.shapes.push(Shape {
            segments,
            scan_slots: scan_slots.into(),
        });
        self.by_text.insert(key.into_boxed_str(), id);
        id
    }

    /// Appends the row's exact text to `out`.
    pub fn write(&self, row: &PackedRow, out: &mut String) {
        let bytes = &row.0;
        let mut at = 0;
        let id = read_len(bytes, &mut at);
        if id == 0 {
            out.push_str(text(&bytes[at..]));
            return;
        }
        let shape = &self.shapes[id - 1];
        let last = shape.segments.len() - 1;
        for seg in &shape.segments[..last] {
            out.push_str(seg);
            let n = read_len(bytes, &mut at);
            out.push_str(text(&bytes[at..at + n]));
            at += n;
        }
        out.push_str(&shape.segments[last]);
    }

    /// The row's exact text.
    pub fn text(&self, row: &PackedRow) -> String {
        let mut out = String::with_capacity(row.0.len() + 128);
        self.write(row, &mut out);
        out
    }

    /// The stored row's values of the scan fields (JSON texts; `None` where it lacks one), read
    /// through its shape.
    pub fn fields<'r>(&self, row: &'r PackedRow) -> Vec<Option<&'r str>> {
        let bytes = &row.0;
        let mut at = 0;
        let id = read_len(bytes, &mut at);
        if id == 0 {
            return scan_whole(&self.scan_fields, text(&bytes[at..]))
                .into_iter()
                .map(|v| v.map(RawValue::get))
                .collect();
        }
        let shape = &self.shapes[id - 1];
        let mut values: Vec<&'r str> = Vec::with_capacity(shape.segments.len() - 1);
        for _ in 1..shape.segments.len() {
            let n = read_len(bytes, &mut at);
            values.push(text(&bytes[at..at + n]));
            at += n;
        }
        shape
            .scan_slots
            .iter()
            .map(|s| s.map(|s| values[s as usize]))
            .collect()
    }
}

/// The field name a shape segment ends with (`,"name":` → `name`), unescaped.
fn segment_key(seg: &str) -> Option<String> {
    let s = seg.trim_end().strip_suffix(':')?.trim_end();
    let s = s.strip_suffix('"')?;
    // The key's opening quote: the last quote not escaped (keys may hold escaped quotes).
    let bytes = s.as_bytes();
    let mut i = bytes.len();
    while i > 0 {
        i -= 1;
        if bytes[i] == b'"' {
            let backslashes = bytes[..i].iter().rev().take_while(|b| **b == b'\\').count();
            if backslashes % 2 == 0 {
                return serde_json::from_str::<String>(&seg[i..=s.len()]).ok();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// Every row comes back byte for byte (whitespace, escapes, nesting, repeated keys, empty
    /// objects, texts that do not parse), and the scan fields read through the shape agree
    /// with a parse of the text.
    #[test]
    fn rows_come_back_exactly_and_fields_are_read_through_the_shape() {
        let scan_fields = fields(&["id", "tenant", "we\"ird"]);
        let mut shapes = Shapes::new(scan_fields.clone());
        let rows = [
            r#"{"amount":12.50,"id":1,"tenant":"tenant-1","payload":{"n":1,"s":"x"}}"#,
            r#"{"amount":1e3,"id":2,"tenant":"tenant-2","payload":{"n":2,"s":"y"}}"#,
            r#"{ "id" : 3 ,  "tenant":"a\"b\\", "tags":["a","b"] }"#,
            r#"{}"#,
            r#"{"id":4,"id":5,"tenant":null}"#,
            r#"{"we\"ird":"é","\u0069d":6}"#,
            "{\"id\":7,\"tenant\":\"\u{1F600}\",\"big\":\"\u{e9}\u{e9}\"}",
            r#"{"id":8,"s":""}"#,
        ];
        let mut packed = Vec::new();
        for r in rows {
            let s = scan(&scan_fields, r).unwrap();
            let want: Vec<Option<String>> = s
                .fields
                .iter()
                .map(|v| v.map(|v| v.get().to_string()))
                .collect();
            let p = shapes.pack(&s);
            assert_eq!(shapes.text(&p), r);
            let got: Vec<Option<String>> = shapes
                .fields(&p)
                .into_iter()
                .map(|v| v.map(str::to_string))
                .collect();
            assert_eq!(got, want, "{r}");
            packed.push(p);
        }
        // Rows of one shape share it: the first two rows, 4 fields each.
        assert_eq!(shapes.shapes.len(), rows.len() - 1);
        assert!(packed[0].stored_len() < rows[0].len() - "amountidtenantpayload".len());
        for (p, r) in packed.iter().zip(rows) {
            assert_eq!(shapes.text(p), r, "still exact after more shapes");
        }
        let whole = Shapes::pack_whole("not json");
        assert_eq!(shapes.text(&whole), "not json");
        assert_eq!(shapes.fields(&whole), vec![None, None, None]);
        let whole = Shapes::pack_whole(r#"{"tenant":"t","id":9}"#);
        assert_eq!(shapes.fields(&whole), vec![Some("9"), Some("\"t\""), None]);
    }

    #[test]
    fn past_the_shape_limit_rows_are_kept_whole() {
        let mut shapes = Shapes::new(fields(&["id"]));
        for i in 0..MAX_SHAPES + 10 {
            let r = format!(r#"{{"id":{i},"f{i}":1}}"#);
            let p = shapes.pack(&scan(shapes.scan_fields(), &r).unwrap());
            assert_eq!(shapes.text(&p), r);
            assert_eq!(shapes.fields(&p), vec![Some(i.to_string().as_str())]);
        }
        assert_eq!(shapes.shapes.len(), MAX_SHAPES);
    }

    #[test]
    fn lengths_past_one_byte_round_trip() {
        let mut shapes = Shapes::new(fields(&["id"]));
        let long = "x".repeat(100_000);
        let r = format!(r#"{{"id":1,"s":"{long}"}}"#);
        let p = shapes.pack(&scan(shapes.scan_fields(), &r).unwrap());
        assert_eq!(shapes.text(&p), r);
    }
}
