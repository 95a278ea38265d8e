//! Protobuf: size-delimited `laredo.snapshotter.v1.SnapshotRow` / `DiffChange` records with
//! `google.protobuf.Struct` rows (laredo spec §3.2). Numbers are doubles on the wire.

use std::collections::BTreeMap;
use std::io::BufRead;

use prost::Message;
use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value as PbValue};
use serde_json::value::RawValue;

use super::{DecodedRow, MAX_PROTOBUF_RECORD, MAX_PROTOBUF_RECORD_READ};
use crate::error::{ArchiveError, Result};
use crate::identity::identity_of;
use crate::model::{Action, Change};
use crate::value::Row;

#[derive(Clone, PartialEq, Message)]
pub struct SnapshotRow {
    #[prost(message, optional, tag = "1")]
    pub row: Option<Struct>,
}

#[derive(Clone, PartialEq, Message)]
pub struct DiffChange {
    #[prost(string, tag = "1")]
    pub action: String,
    #[prost(string, tag = "2")]
    pub key: String,
    #[prost(message, optional, tag = "3")]
    pub old: Option<Struct>,
    #[prost(message, optional, tag = "4")]
    pub new: Option<Struct>,
}

/// JSON row → Struct (numbers become doubles, as in laredo).
pub fn row_to_struct(row: &Row) -> Result<Struct> {
    let v: serde_json::Value = serde_json::from_str(row.as_str())
        .map_err(|e| ArchiveError::Invalid(format!("row is not JSON: {e}")))?;
    match json_to_pb(v).kind {
        Some(Kind::StructValue(s)) => Ok(s),
        _ => Err(ArchiveError::Invalid("a row must be a JSON object".into())),
    }
}

fn json_to_pb(v: serde_json::Value) -> PbValue {
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        serde_json::Value::String(s) => Kind::StringValue(s),
        serde_json::Value::Array(a) => Kind::ListValue(ListValue {
            values: a.into_iter().map(json_to_pb).collect(),
        }),
        serde_json::Value::Object(o) => Kind::StructValue(Struct {
            fields: o.into_iter().map(|(k, v)| (k, json_to_pb(v))).collect(),
        }),
    };
    PbValue { kind: Some(kind) }
}

/// Struct → JSON row text (sorted keys; integral doubles as integers).
pub fn struct_to_row(s: &Struct) -> Row {
    let mut out = String::with_capacity(128);
    write_struct(&mut out, s);
    Row::from_validated(&out)
}

fn write_struct(out: &mut String, s: &Struct) {
    out.push('{');
    let sorted: BTreeMap<&String, &PbValue> = s.fields.iter().collect();
    for (i, (k, v)) in sorted.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&serde_json::to_string(k).expect("strings serialize"));
        out.push(':');
        write_value(out, v);
    }
    out.push('}');
}

fn write_value(out: &mut String, v: &PbValue) {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => out.push_str("null"),
        Some(Kind::BoolValue(b)) => out.push_str(if *b { "true" } else { "false" }),
        Some(Kind::NumberValue(n)) => out.push_str(&number_text(*n)),
        Some(Kind::StringValue(s)) => {
            out.push_str(&serde_json::to_string(s).expect("strings serialize"))
        }
        Some(Kind::ListValue(l)) => {
            out.push('[');
            for (i, item) in l.values.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Some(Kind::StructValue(s)) => write_struct(out, s),
    }
}

/// A double as JSON: integral values within ±2^63 as integers, others in shortest form;
/// NaN and infinities (not JSON) as strings.
pub fn number_text(n: f64) -> String {
    if n.is_nan() {
        return "\"NaN\"".into();
    }
    if n.is_infinite() {
        return if n > 0.0 {
            "\"Infinity\"".into()
        } else {
            "\"-Infinity\"".into()
        };
    }
    if n.fract() == 0.0 && n.abs() < 9.2e18 {
        return format!("{}", n as i64);
    }
    serde_json::to_string(&n).expect("finite floats serialize")
}

fn put_record(out: &mut Vec<u8>, msg: &impl Message, what: &str) -> Result<()> {
    let len = msg.encoded_len();
    if len > MAX_PROTOBUF_RECORD {
        return Err(ArchiveError::Invalid(format!(
            "a {what} record of {len} bytes exceeds the 4 MiB protobuf record limit laredo can read"
        )));
    }
    msg.encode_length_delimited(out)
        .map_err(|e| ArchiveError::Invalid(format!("protobuf encode: {e}")))
}

pub fn encode_row(out: &mut Vec<u8>, row: &Row) -> Result<()> {
    put_record(
        out,
        &SnapshotRow {
            row: Some(row_to_struct(row)?),
        },
        "snapshot row",
    )
}

pub fn encode_change(out: &mut Vec<u8>, change: &Change) -> Result<()> {
    let conv =
        |r: &Option<Row>| -> Result<Option<Struct>> { r.as_ref().map(row_to_struct).transpose() };
    let msg = DiffChange {
        action: change.action.as_str().to_string(),
        key: change.key.clone(),
        old: conv(&change.old)?,
        new: conv(&change.new)?,
    };
    put_record(out, &msg, "diff change")
}

/// Reads size-delimited records; EOF is only clean at a record boundary.
struct RecordReader<'a> {
    key: &'a str,
    reader: Box<dyn BufRead + 'a>,
    buf: Vec<u8>,
    index: u64,
}

impl<'a> RecordReader<'a> {
    fn next_record(&mut self) -> Result<Option<&[u8]>> {
        let mut len: u64 = 0;
        let mut shift = 0;
        let mut first = true;
        loop {
            let mut byte = [0u8; 1];
            let n = read_some(&mut self.reader, &mut byte)
                .map_err(|e| ArchiveError::storage(self.key, e))?;
            if n == 0 {
                if first {
                    return Ok(None);
                }
                return Err(self.truncated("inside a record's length prefix"));
            }
            first = false;
            len |= u64::from(byte[0] & 0x7f) << shift;
            if byte[0] & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 63 {
                return Err(ArchiveError::Corrupt {
                    key: self.key.to_string(),
                    detail: format!("record {}: invalid length prefix", self.index + 1),
                });
            }
        }
        if len as usize > MAX_PROTOBUF_RECORD_READ {
            return Err(ArchiveError::Corrupt {
                key: self.key.to_string(),
                detail: format!(
                    "record {} claims {len} bytes, over the {} MiB limit",
                    self.index + 1,
                    MAX_PROTOBUF_RECORD_READ >> 20
                ),
            });
        }
        self.buf.resize(len as usize, 0);
        let mut filled = 0;
        while filled < self.buf.len() {
            let n = read_some(&mut self.reader, &mut self.buf[filled..])
                .map_err(|e| ArchiveError::storage(self.key, e))?;
            if n == 0 {
                return Err(self.truncated(&format!(
                    "record {} has {filled} of {len} bytes",
                    self.index + 1
                )));
            }
            filled += n;
        }
        self.index += 1;
        Ok(Some(&self.buf))
    }

    fn truncated(&self, detail: &str) -> ArchiveError {
        ArchiveError::Truncated {
            key: self.key.to_string(),
            detail: format!("object ends {detail}"),
        }
    }

    fn corrupt(&self, e: prost::DecodeError) -> ArchiveError {
        ArchiveError::Corrupt {
            key: self.key.to_string(),
            detail: format!("record {}: {e}", self.index),
        }
    }
}

fn read_some(r: &mut Box<dyn BufRead + '_>, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

pub struct RowDecoder<'a> {
    records: RecordReader<'a>,
    key_fields: &'a [String],
    done: bool,
}

impl<'a> RowDecoder<'a> {
    pub fn new(key: &'a str, reader: Box<dyn BufRead + 'a>, key_fields: &'a [String]) -> Self {
        RowDecoder {
            records: RecordReader {
                key,
                reader,
                buf: Vec::new(),
                index: 0,
            },
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
        let out = match self.records.next_record() {
            Ok(None) => None,
            Ok(Some(bytes)) => Some(
                SnapshotRow::decode(bytes)
                    .map_err(|e| self.records.corrupt(e))
                    .map(|m| {
                        let row = m.row.as_ref().map(struct_to_row).unwrap_or_else(Row::empty);
                        let values: Vec<Option<Box<RawValue>>> =
                            self.key_fields.iter().map(|k| row.get(k)).collect();
                        let refs: Vec<Option<&RawValue>> =
                            values.iter().map(|v| v.as_deref()).collect();
                        DecodedRow {
                            identity: identity_of(&refs),
                            row,
                        }
                    }),
            ),
            Err(e) => Some(Err(e)),
        };
        if !matches!(out, Some(Ok(_))) {
            self.done = true;
        }
        out
    }
}

pub struct ChangeDecoder<'a> {
    records: RecordReader<'a>,
    done: bool,
}

impl<'a> ChangeDecoder<'a> {
    pub fn new(key: &'a str, reader: Box<dyn BufRead + 'a>) -> Self {
        ChangeDecoder {
            records: RecordReader {
                key,
                reader,
                buf: Vec::new(),
                index: 0,
            },
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
        let out = match self.records.next_record() {
            Ok(None) => None,
            Ok(Some(bytes)) => Some(
                DiffChange::decode(bytes)
                    .map_err(|e| self.records.corrupt(e))
                    .and_then(|m| {
                        let action =
                            Action::parse(&m.action).ok_or_else(|| ArchiveError::Corrupt {
                                key: self.records.key.to_string(),
                                detail: format!(
                                    "record {}: unknown action {:?}",
                                    self.records.index, m.action
                                ),
                            })?;
                        Ok(Change {
                            action,
                            key: m.key,
                            old: m.old.as_ref().map(struct_to_row),
                            new: m.new.as_ref().map(struct_to_row),
                        })
                    }),
            ),
            Err(e) => Some(Err(e)),
        };
        if !matches!(out, Some(Ok(_))) {
            self.done = true;
        }
        out
    }
}
