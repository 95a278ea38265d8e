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

use larch_archive::value::Row;

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

/// Appends `row` as one line of COPY text over `columns` (in their order).
pub fn encode_row(row: &Row, columns: &[CopyColumn], out: &mut Vec<u8>) -> anyhow::Result<()> {
    let fields = row
        .fields()
        .context("a baseline row is not a JSON object")?;
    for (i, c) in columns.iter().enumerate() {
        if i > 0 {
            out.push(b'\t');
        }
        match fields.get(c.name.as_str()) {
            None => out.extend_from_slice(b"\\N"),
            Some(v) if v.get() == "null" => out.extend_from_slice(b"\\N"),
            Some(v) => {
                encode_value(v, c.kind, out).with_context(|| format!("column {:?}", c.name))?
            }
        }
    }
    out.push(b'\n');
    Ok(())
}

fn encode_value(v: &RawValue, kind: Kind, out: &mut Vec<u8>) -> anyhow::Result<()> {
    let mut text = String::new();
    match kind {
        Kind::Json => {
            copy_escape(v.get(), out);
            return Ok(());
        }
        Kind::Scalar => {
            copy_escape(&scalar_text(v)?, out);
            return Ok(());
        }
        Kind::Bytea => bytea_hex(&scalar_text(v)?, &mut text)?,
        Kind::Array(element) => {
            let raw = v.get().trim_start();
            if raw.starts_with('[') {
                array_literal(v, element, &mut text)?;
            } else {
                // A literal already in PostgreSQL's array syntax (laredo's diffs carry strings).
                text.push_str(&scalar_text(v)?);
            }
        }
    }
    copy_escape(&text, out);
    Ok(())
}

/// A JSON string's content, or any other value's JSON text.
fn scalar_text(v: &RawValue) -> anyhow::Result<Cow<'_, str>> {
    if v.get().trim_start().starts_with('"') {
        Ok(serde_json::from_str::<Cow<'_, str>>(v.get())?)
    } else {
        Ok(Cow::Borrowed(v.get().trim()))
    }
}

fn bytea_hex(base64: &str, out: &mut String) -> anyhow::Result<()> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(base64)
        .context("a bytea value is not base64")?;
    out.push_str("\\x");
    out.push_str(&hex::encode(bytes));
    Ok(())
}

/// A JSON array as a PostgreSQL array literal: `{…}`, nested arrays for dimensions, `NULL`,
/// every other element double-quoted with `"` and `\` escaped.
fn array_literal(v: &RawValue, element: Element, out: &mut String) -> anyhow::Result<()> {
    let items: Vec<&RawValue> = serde_json::from_str(v.get()).context("not a JSON array")?;
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
            array_literal(item, element, out)?;
            continue;
        }
        let mut text = String::new();
        match element {
            Element::Json => text.push_str(item.get()),
            Element::Scalar => text.push_str(&scalar_text(item)?),
            Element::Bytea => bytea_hex(&scalar_text(item)?, &mut text)?,
        }
        out.push('"');
        for ch in text.chars() {
            if ch == '"' || ch == '\\' {
                out.push('\\');
            }
            out.push(ch);
        }
        out.push('"');
    }
    out.push('}');
    Ok(())
}

/// COPY text escaping: backslash, and the delimiter and line characters.
fn copy_escape(text: &str, out: &mut Vec<u8>) {
    for &b in text.as_bytes() {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            0 => {
                // PostgreSQL text cannot hold NUL: refused by the server either way, said here.
                out.extend_from_slice(b"\\0");
            }
            _ => out.push(b),
        }
    }
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
