//! Rows as `COPY … FROM STDIN` text for the PostgreSQL target's baseline: each archived JSON
//! value becomes the text input of its destination column, so PostgreSQL parses it exactly as
//! it would the source's own text output (docs/postgres-types.md maps the other way).
//!
//! * strings are unquoted (the text they carry is the type's input: timestamps, intervals,
//!   `inet`, `NaN`, BC dates, …); numbers, booleans, objects keep their JSON text;
//! * `json`/`jsonb` columns take the JSON text itself (a JSON string stays a JSON string);
//! * `bytea` arrives as base64 and is written as `\x` hex;
//! * arrays (JSON arrays) become array literals with every element quoted;
//! * a missing field or JSON `null` is `NULL`.

use std::borrow::Cow;

use anyhow::{Context, bail};
use base64::Engine as _;
use serde_json::value::RawValue;

mod chunk_pool;
mod compact_row;

pub use chunk_pool::ChunkPool;

/// How a destination column's value is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Scalar,
    Json,
    Bytea,
    /// An array of elements of this kind (never itself an array).
    Array(Element),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    Scalar,
    Json,
    Bytea,
}

impl Kind {
    /// From the column's base type name (domains resolved) and, for arrays, the element's.
    pub fn of(type_name: &str, element: Option<&str>) -> Kind {
        let scalar = |t: &str| match t {
            "json" | "jsonb" => Element::Json,
            "bytea" => Element::Bytea,
            _ => Element::Scalar,
        };
        match element {
            Some(e) => Kind::Array(scalar(e)),
            None => match scalar(type_name) {
                Element::Json => Kind::Json,
                Element::Bytea => Kind::Bytea,
                Element::Scalar => Kind::Scalar,
            },
        }
    }
}

#[derive(Clone, Debug)]
pub struct CopyColumn {
    pub name: String,
    pub kind: Kind,
}

/// Encodes rows (JSON objects as text) into COPY lines in one pass over each row's text: the
/// fields are matched to their columns as the object is scanned (`compact_row`, or
/// serde_json for a row not in the archives' compact form), with no map, no value copied and
/// the scratch buffers reused from row to row.
pub struct CopyEncoder {
    columns: Vec<CopyColumn>,
    /// Column names sorted, with their column's index: rows' keys come sorted, so the next
    /// name is almost always the one after the last match.
    by_name: Vec<(String, usize)>,
    /// Per column, the byte range of its value in the row being encoded.
    slots: Vec<Option<(usize, usize)>>,
    bytes: Vec<u8>,
    text: String,
}

impl CopyEncoder {
    pub fn new(columns: &[CopyColumn]) -> CopyEncoder {
        let mut by_name: Vec<(String, usize)> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.clone(), i))
            .collect();
        by_name.sort();
        CopyEncoder {
            columns: columns.to_vec(),
            by_name,
            slots: vec![None; columns.len()],
            bytes: Vec::new(),
            text: String::new(),
        }
    }

    /// Appends the JSON object `row` as one line of COPY text; on an error `out` may hold
    /// part of the line.
    pub fn encode(&mut self, row: &str, out: &mut Vec<u8>) -> anyhow::Result<()> {
        self.slots.iter_mut().for_each(|s| *s = None);
        let (escapes, control) = compact_row::specials(row.as_bytes());
        let taken = !control && {
            let (by_name, slots, mut hint) = (&self.by_name, &mut self.slots, 0usize);
            compact_row::fields(row, |key, start, end| {
                match column_of(by_name, &mut hint, key) {
                    Some(i) => {
                        slots[i] = Some((start, end));
                        true
                    }
                    None => false,
                }
            })
            .is_some()
        };
        if !taken {
            self.slots.iter_mut().for_each(|s| *s = None);
            let mut de = serde_json::Deserializer::from_str(row);
            serde::de::DeserializeSeed::deserialize(
                Fields {
                    row,
                    by_name: &self.by_name,
                    slots: &mut self.slots,
                },
                &mut de,
            )
            .and_then(|()| de.end())
            .context("a baseline row is not a JSON object")?;
        }
        for (i, c) in self.columns.iter().enumerate() {
            if i > 0 {
                out.push(b'\t');
            }
            let value = self.slots[i].map(|(start, end)| &row[start..end]);
            match value {
                None | Some("null") => out.extend_from_slice(b"\\N"),
                Some(v) => encode_value(
                    v,
                    c.kind,
                    Scratch {
                        bytes: &mut self.bytes,
                        text: &mut self.text,
                        escapes,
                        checked: !taken,
                    },
                    out,
                )
                .with_context(|| format!("column {:?}", c.name))?,
            }
        }
        out.push(b'\n');
        Ok(())
    }
}

/// The index of the column named `name`: rows' keys come sorted, so `hint` (the entry after
/// the last match) is tried first.
fn column_of(by_name: &[(String, usize)], hint: &mut usize, name: &str) -> Option<usize> {
    let found = match by_name.get(*hint) {
        Some((n, _)) if n == name => Some(*hint),
        _ => by_name.binary_search_by(|(n, _)| n.as_str().cmp(name)).ok(),
    };
    found.map(|at| {
        *hint = at + 1;
        by_name[at].1
    })
}

/// Parses a row's object, noting where each column's value is (the last of a repeated key).
struct Fields<'a> {
    row: &'a str,
    by_name: &'a [(String, usize)],
    slots: &'a mut [Option<(usize, usize)>],
}

impl<'de> serde::de::DeserializeSeed<'de> for Fields<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Fields<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object (one row)")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let base = self.row.as_ptr() as usize;
        let mut hint = 0usize;
        while let Some(column) = map.next_key_seed(ColumnOf {
            by_name: self.by_name,
            hint: &mut hint,
        })? {
            match column {
                Some(i) => {
                    let v: &'de RawValue = map.next_value()?;
                    // The value is a slice of the row's text (the deserializer borrows).
                    let start = v.get().as_ptr() as usize - base;
                    self.slots[i] = Some((start, start + v.get().len()));
                }
                None => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// A field name's column index, if it names a column.
struct ColumnOf<'a> {
    by_name: &'a [(String, usize)],
    hint: &'a mut usize,
}

impl<'de> serde::de::DeserializeSeed<'de> for ColumnOf<'_> {
    type Value = Option<usize>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ColumnOf<'_> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E>(self, name: &str) -> Result<Option<usize>, E> {
        Ok(column_of(self.by_name, self.hint, name))
    }
}

/// What [`encode_value`] reuses and knows of the row.
struct Scratch<'a> {
    bytes: &'a mut Vec<u8>,
    text: &'a mut String,
    /// Whether the row has a byte COPY may need to escape; without one, values are copied.
    escapes: bool,
    /// Whether nested values were parsed (serde_json) rather than only bracket-matched.
    checked: bool,
}

/// Appends one non-null value (its JSON text) as the text input of a column of `kind`.
fn encode_value(
    v: &str,
    kind: Kind,
    scratch: Scratch<'_>,
    out: &mut Vec<u8>,
) -> anyhow::Result<()> {
    let Scratch {
        bytes,
        text,
        escapes,
        checked,
    } = scratch;
    let escape = |value: &[u8], out: &mut Vec<u8>| {
        if escapes {
            copy_escape(value, out)
        } else {
            out.extend_from_slice(value)
        }
    };
    if !checked && matches!(kind, Kind::Scalar | Kind::Bytea) && v.starts_with(['{', '[']) {
        serde_json::from_str::<serde::de::IgnoredAny>(v).context("not JSON")?;
    }
    match kind {
        // PostgreSQL's json input checks the text.
        Kind::Json => escape(v.as_bytes(), out),
        Kind::Scalar => escape(scalar_text(v)?.as_bytes(), out),
        Kind::Bytea => {
            text.clear();
            bytea_hex(&scalar_text(v)?, bytes, text)?;
            // `\x` and hex digits: only the backslash is escaped.
            out.push(b'\\');
            out.extend_from_slice(text.as_bytes());
        }
        Kind::Array(element) => {
            text.clear();
            if v.starts_with('[') {
                array_literal(v, element, bytes, text)?;
            } else {
                // A literal already in PostgreSQL's array syntax (laredo's diffs carry strings).
                text.push_str(&scalar_text(v)?);
            }
            if element == Element::Scalar {
                // Quoted scalars carry a backslash only where the row has one.
                escape(text.as_bytes(), out);
            } else {
                // Quoted JSON and bytea elements carry backslashes of their own.
                copy_escape(text.as_bytes(), out);
            }
        }
    }
    Ok(())
}

/// A JSON string's content, or any other value's JSON text. A string without escapes is
/// borrowed (it then holds no control character either: JSON forbids them raw).
fn scalar_text(v: &str) -> anyhow::Result<Cow<'_, str>> {
    let v = v.trim_ascii();
    if let Some(inner) = v.strip_prefix('"').and_then(|s| s.strip_suffix('"'))
        && memchr::memchr(b'\\', inner.as_bytes()).is_none()
    {
        return Ok(Cow::Borrowed(inner));
    }
    if v.starts_with('"') {
        Ok(serde_json::from_str::<Cow<'_, str>>(v)?)
    } else {
        Ok(Cow::Borrowed(v))
    }
}

fn bytea_hex(base64: &str, bytes: &mut Vec<u8>, out: &mut String) -> anyhow::Result<()> {
    bytes.clear();
    base64::engine::general_purpose::STANDARD
        .decode_vec(base64, bytes)
        .context("a bytea value is not base64")?;
    out.push_str("\\x");
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes.iter() {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 15) as usize] as char);
    }
    Ok(())
}

/// A JSON array as a PostgreSQL array literal: `{…}`, nested arrays for dimensions, `NULL`,
/// every other element double-quoted with `"` and `\` escaped.
fn array_literal(
    v: &str,
    element: Element,
    bytes: &mut Vec<u8>,
    out: &mut String,
) -> anyhow::Result<()> {
    if element == Element::Scalar {
        let start = out.len();
        let flat = compact_row::flat_array(v, |item| {
            out.push(if out.len() == start { '{' } else { ',' });
            match item {
                // Neither needs escaping inside the quotes: no `"` or `\` without an escape.
                compact_row::Item::Text(text) | compact_row::Item::Bare(text) => {
                    out.push('"');
                    out.push_str(text);
                    out.push('"');
                }
                compact_row::Item::Null => out.push_str("NULL"),
            }
        });
        if flat.is_some() {
            if out.len() == start {
                out.push('{');
            }
            out.push('}');
            return Ok(());
        }
        out.truncate(start);
    }
    let mut de = serde_json::Deserializer::from_str(v);
    let items: Vec<&RawValue> =
        serde::Deserialize::deserialize(&mut de).context("not a JSON array")?;
    out.push('{');
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let raw = item.get().trim_start();
        if raw == "null" {
            out.push_str("NULL");
            continue;
        }
        if raw.starts_with('[') && element != Element::Json {
            array_literal(raw, element, bytes, out)?;
            continue;
        }
        out.push('"');
        match element {
            Element::Json => quote_element(item.get(), out),
            Element::Scalar => quote_element(&scalar_text(raw)?, out),
            Element::Bytea => {
                let mut hex = String::new();
                bytea_hex(&scalar_text(raw)?, bytes, &mut hex)?;
                quote_element(&hex, out);
            }
        }
        out.push('"');
    }
    out.push('}');
    Ok(())
}

/// An array element's text inside its double quotes: `"` and `\` escaped.
fn quote_element(text: &str, out: &mut String) {
    let mut rest = text;
    while let Some(at) = rest.find(['"', '\\']) {
        out.push_str(&rest[..at]);
        out.push('\\');
        out.push_str(&rest[at..at + 1]);
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
}

/// COPY text escaping: backslash, and the delimiter and line characters.
fn copy_escape(text: &[u8], out: &mut Vec<u8>) {
    // Most values need none: one branch-free pass over them (vectorised) says so.
    let special = text
        .iter()
        .fold(0u8, |any, &b| any | u8::from((b == b'\\') | (b < 0x0e)));
    if special == 0 {
        out.extend_from_slice(text);
        return;
    }
    let mut start = 0;
    for (i, &b) in text.iter().enumerate() {
        let escaped: &[u8] = match b {
            b'\\' => b"\\\\",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            // PostgreSQL text cannot hold NUL: refused by the server either way, said here.
            0 => b"\\0",
            _ => continue,
        };
        out.extend_from_slice(&text[start..i]);
        out.extend_from_slice(escaped);
        start = i + 1;
    }
    out.extend_from_slice(&text[start..]);
}

/// The columns of `table` as COPY writes them: name and kind (domains by their base type).
pub async fn copy_columns(
    client: &tokio_postgres::Client,
    table: &str,
) -> anyhow::Result<Vec<CopyColumn>> {
    let rows = client
        .query(
            "SELECT a.attname::text, b.typname::text, e.typname::text \
               FROM pg_attribute a \
               JOIN pg_type t ON t.oid = a.atttypid \
               JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END \
               LEFT JOIN pg_type e ON e.oid = b.typelem AND b.typcategory = 'A' \
              WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped \
                AND a.attgenerated = '' \
              ORDER BY a.attnum",
            &[&table],
        )
        .await
        .with_context(|| format!("postgres target: reading the columns of {table}"))?;
    if rows.is_empty() {
        bail!("postgres target: table {table} has no columns to copy into");
    }
    Ok(rows
        .iter()
        .map(|r| {
            let element: Option<String> = r.get(2);
            CopyColumn {
                name: r.get(0),
                kind: Kind::of(r.get::<_, &str>(1), element.as_deref()),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use larch_archive::value::Row;

    fn encode_row(row: &Row, columns: &[CopyColumn], out: &mut Vec<u8>) -> anyhow::Result<()> {
        CopyEncoder::new(columns).encode(row.as_str(), out)
    }

    fn line(row: &str, cols: &[(&str, Kind)]) -> String {
        let cols: Vec<CopyColumn> = cols
            .iter()
            .map(|(n, k)| CopyColumn {
                name: n.to_string(),
                kind: *k,
            })
            .collect();
        let mut out = Vec::new();
        encode_row(&Row::parse(row).unwrap(), &cols, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn values_become_the_columns_text_input() {
        let cols = [
            ("id", Kind::Scalar),
            ("s", Kind::Scalar),
            ("j", Kind::Json),
            ("b", Kind::Bytea),
            ("missing", Kind::Scalar),
            ("n", Kind::Scalar),
        ];
        assert_eq!(
            line(
                r#"{"id":9007199254740993,"s":"a\tb\\c\nd\"","j":{"k":"x\ty"},"b":"AQL/","n":null}"#,
                &cols
            ),
            "9007199254740993\ta\\tb\\\\c\\nd\"\t{\"k\":\"x\\\\ty\"}\t\\\\x0102ff\t\\N\t\\N\n"
        );
        // A JSON string in a json column stays a JSON string.
        assert_eq!(line(r#"{"j":"text"}"#, &[("j", Kind::Json)]), "\"text\"\n");
    }

    #[test]
    fn arrays_become_quoted_literals() {
        let text = Kind::Array(Element::Scalar);
        assert_eq!(
            line(
                r#"{"a":[["a b","NULL",null],["q\"","back\\slash","{x}"]]}"#,
                &[("a", text)]
            ),
            "{{\"a b\",\"NULL\",NULL},{\"q\\\\\"\",\"back\\\\\\\\slash\",\"{x}\"}}\n"
        );
        assert_eq!(
            line(
                r#"{"a":[{"k":1},"s",[1]]}"#,
                &[("a", Kind::Array(Element::Json))]
            ),
            "{\"{\\\\\"k\\\\\":1}\",\"\\\\\"s\\\\\"\",\"[1]\"}\n"
        );
        assert_eq!(
            line(
                r#"{"a":["AQL/",null]}"#,
                &[("a", Kind::Array(Element::Bytea))]
            ),
            "{\"\\\\\\\\x0102ff\",NULL}\n"
        );
        // A literal already in array syntax passes through.
        assert_eq!(line(r#"{"a":"{1,2}"}"#, &[("a", text)]), "{1,2}\n");
        assert_eq!(line(r#"{"a":[]}"#, &[("a", text)]), "{}\n");
    }

    /// One encoder over many rows: keys in any order, escaped names, repeated keys (the last
    /// wins, as a map would keep it), fields that are no column, values with JSON escapes.
    #[test]
    fn an_encoder_matches_fields_to_columns_whatever_their_order() {
        let columns: Vec<CopyColumn> = [
            ("b", Kind::Bytea),
            ("id", Kind::Scalar),
            ("z", Kind::Scalar),
        ]
        .iter()
        .map(|(n, k)| CopyColumn {
            name: n.to_string(),
            kind: *k,
        })
        .collect();
        let mut encoder = CopyEncoder::new(&columns);
        let mut out = Vec::new();
        for row in [
            r#"{"z":"last","id":1,"b":"AQL\/"}"#,
            r#"{"\u0069d":2,"other":[1,{"x":"\t"}],"z":"\u00e9\n","z":"kept"}"#,
            r#"{"id":3}"#,
        ] {
            encoder.encode(row, &mut out).unwrap();
        }
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "\\\\x0102ff\t1\tlast\n\\N\t2\tkept\n\\N\t3\t\\N\n"
        );
        let e = encoder
            .encode(r#"{"id":1,"z":"#, &mut Vec::new())
            .unwrap_err();
        assert!(format!("{e:#}").contains("not a JSON object"), "{e:#}");
    }

    #[test]
    fn a_bad_value_names_its_column() {
        let cols = vec![CopyColumn {
            name: "blob".into(),
            kind: Kind::Bytea,
        }];
        let e = encode_row(
            &Row::parse(r#"{"blob":"not base64!"}"#).unwrap(),
            &cols,
            &mut Vec::new(),
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("column \"blob\""), "{e:#}");
    }
}
