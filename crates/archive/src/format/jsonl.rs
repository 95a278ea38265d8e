//! JSONL: one compact JSON object per line, `\n`-terminated (laredo spec §3.1).

use std::borrow::Cow;
use std::io::BufRead;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{DecodedRow, MAX_JSONL_LINE};
use crate::error::{ArchiveError, Result};
use crate::identity::{KeyCapture, identity_of};
use crate::model::{Action, Change};
use crate::value::Row;

pub fn encode_row(out: &mut Vec<u8>, row: &Row) -> Result<()> {
    let text = row.as_str();
    if text.len() + 1 > MAX_JSONL_LINE {
        return Err(ArchiveError::Invalid(format!(
            "a row of {} bytes exceeds the 16 MiB JSONL line limit laredo can read",
            text.len()
        )));
    }
    if text.contains('\n') {
        // Rows from our decoders are single-line; re-encode anything else compactly.
        let row = Row::parse(text)
            .map_err(|e| ArchiveError::Invalid(format!("row is not a JSON object: {e}")))?;
        out.extend_from_slice(row.as_str().as_bytes());
    } else {
        out.extend_from_slice(text.as_bytes());
    }
    out.push(b'\n');
    Ok(())
}

#[derive(Serialize)]
struct ChangeOut<'a> {
    action: &'static str,
    key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    old: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    new: Option<&'a RawValue>,
}

fn raw_row(row: &Option<Row>) -> Option<Box<RawValue>> {
    // laredo omits old/new when nil or empty.
    row.as_ref()
        .filter(|r| !r.is_empty())
        .map(|r| RawValue::from_string(r.as_str().to_string()).expect("rows are valid JSON"))
}

pub fn encode_change(out: &mut Vec<u8>, change: &Change) -> Result<()> {
    let old = raw_row(&change.old);
    let new = raw_row(&change.new);
    let start = out.len();
    serde_json::to_writer(
        &mut *out,
        &ChangeOut {
            action: change.action.as_str(),
            key: &change.key,
            old: old.as_deref(),
            new: new.as_deref(),
        },
    )
    .map_err(|e| ArchiveError::Invalid(format!("encoding change: {e}")))?;
    if out.len() - start + 1 > MAX_JSONL_LINE {
        return Err(ArchiveError::Invalid(format!(
            "a change record of {} bytes exceeds the 16 MiB JSONL line limit laredo can read",
            out.len() - start
        )));
    }
    out.push(b'\n');
    Ok(())
}

/// Reads lines of at most 16 MiB; strips `\r`; skips blank lines; tracks line numbers.
pub struct LineReader<'a> {
    key: &'a str,
    reader: Box<dyn BufRead + 'a>,
    pub line_no: u64,
    buf: Vec<u8>,
}

impl<'a> LineReader<'a> {
    pub fn new(key: &'a str, reader: Box<dyn BufRead + 'a>) -> Self {
        LineReader {
            key,
            reader,
            line_no: 0,
            buf: Vec::with_capacity(4096),
        }
    }

    /// The next non-blank line, or `None` at the end.
    pub fn next_line(&mut self) -> Result<Option<&str>> {
        loop {
            self.buf.clear();
            self.line_no += 1;
            let mut got_any = false;
            loop {
                let key = self.key;
                let available = self.reader.fill_buf().map_err(|e| read_error(key, e))?;
                if available.is_empty() {
                    break;
                }
                got_any = true;
                let (chunk, done) = match memchr(available) {
                    Some(i) => (&available[..i], Some(i + 1)),
                    None => (available, None),
                };
                if self.buf.len() + chunk.len() > MAX_JSONL_LINE {
                    return Err(ArchiveError::BadLine {
                        key: self.key.to_string(),
                        line: self.line_no,
                        detail: "line exceeds the 16 MiB limit".into(),
                    });
                }
                self.buf.extend_from_slice(chunk);
                let consumed = done.unwrap_or(available.len());
                self.reader.consume(consumed);
                if done.is_some() {
                    break;
                }
            }
            if !got_any {
                return Ok(None);
            }
            while matches!(self.buf.last(), Some(b'\r' | b' ' | b'\t')) {
                self.buf.pop();
            }
            if self.buf.iter().all(|c| c.is_ascii_whitespace()) {
                continue;
            }
            let line_no = self.line_no;
            let key = self.key;
            return std::str::from_utf8(&self.buf)
                .map(Some)
                .map_err(|e| ArchiveError::BadLine {
                    key: key.to_string(),
                    line: line_no,
                    detail: format!("not UTF-8: {e}"),
                });
        }
    }

    pub fn bad_line(&self, detail: impl std::fmt::Display) -> ArchiveError {
        ArchiveError::BadLine {
            key: self.key.to_string(),
            line: self.line_no,
            detail: detail.to_string(),
        }
    }
}

fn read_error(key: &str, e: std::io::Error) -> ArchiveError {
    ArchiveError::storage(key, e)
}

fn memchr(b: &[u8]) -> Option<usize> {
    memchr::memchr(b'\n', b)
}

pub struct RowDecoder<'a> {
    lines: LineReader<'a>,
    key_fields: &'a [String],
    done: bool,
}

impl<'a> RowDecoder<'a> {
    pub fn new(key: &'a str, reader: Box<dyn BufRead + 'a>, key_fields: &'a [String]) -> Self {
        RowDecoder {
            lines: LineReader::new(key, reader),
            key_fields,
            done: false,
        }
    }
}

impl Iterator for RowDecoder<'_> {
    type Item = Result<DecodedRow>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let key_fields = self.key_fields;
        let result = match self.lines.next_line() {
            Ok(None) => {
                self.done = true;
                return None;
            }
            Ok(Some(line)) => match KeyCapture::scan(key_fields, line) {
                Ok(values) => Ok(DecodedRow {
                    identity: identity_of(&values),
                    row: Row::from_validated(line),
                }),
                Err(e) => Err(e),
            },
            Err(e) => {
                self.done = true;
                return Some(Err(e));
            }
        };
        Some(result.map_err(|e| {
            self.done = true;
            self.lines.bad_line(format!("not a JSON object: {e}"))
        }))
    }
}

#[derive(Deserialize)]
struct ChangeIn<'a> {
    #[serde(alias = "Action", alias = "ACTION", borrow)]
    action: Option<Cow<'a, str>>,
    #[serde(alias = "Key", alias = "KEY", borrow, default)]
    key: Option<Cow<'a, str>>,
    #[serde(alias = "Old", alias = "OLD", borrow, default)]
    old: Option<&'a RawValue>,
    #[serde(alias = "New", alias = "NEW", borrow, default)]
    new: Option<&'a RawValue>,
}

fn row_of(raw: Option<&RawValue>) -> std::result::Result<Option<Row>, String> {
    match raw {
        None => Ok(None),
        Some(r) if r.get() == "null" => Ok(None),
        Some(r) if r.get().trim_start().starts_with('{') => Ok(Some(Row::from_validated(r.get()))),
        Some(r) => Err(format!("row must be a JSON object, found {}", r.get())),
    }
}

pub struct ChangeDecoder<'a> {
    lines: LineReader<'a>,
    done: bool,
}

impl<'a> ChangeDecoder<'a> {
    pub fn new(key: &'a str, reader: Box<dyn BufRead + 'a>) -> Self {
        ChangeDecoder {
            lines: LineReader::new(key, reader),
            done: false,
        }
    }
}

impl Iterator for ChangeDecoder<'_> {
    type Item = Result<Change>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let parsed: std::result::Result<Change, String> = match self.lines.next_line() {
            Ok(None) => {
                self.done = true;
                return None;
            }
            Err(e) => {
                self.done = true;
                return Some(Err(e));
            }
            Ok(Some(line)) => (|| {
                let c: ChangeIn<'_> =
                    serde_json::from_str(line).map_err(|e| format!("not a change record: {e}"))?;
                let action_text = c.action.ok_or("missing \"action\"")?;
                let action = Action::parse(&action_text)
                    .ok_or_else(|| format!("unknown action {action_text:?}"))?;
                Ok(Change {
                    action,
                    key: c.key.map(|k| k.into_owned()).unwrap_or_default(),
                    old: row_of(c.old)?,
                    new: row_of(c.new)?,
                })
            })(),
        };
        Some(parsed.map_err(|e| {
            self.done = true;
            self.lines.bad_line(e)
        }))
    }
}
