//! Artifact formats: `jsonl` and `protobuf` exactly as laredo writes them, and larch's opt-in
//! `jsonl+zstd` (zstd-compressed JSONL under its own format id). Encoders append to a buffer the
//! caller drains into a streaming upload; decoders read from a streaming download, one record at
//! a time (rule R8).

pub mod jsonl;
pub mod line_blocks;
pub mod protobuf;

use std::fmt;
use std::io::{BufRead, Read};

use super::error::{ArchiveError, Result};
use super::identity::Identity;
use super::model::Change;
use super::value::Row;

/// laredo's JSONL line limit (its reader's scanner buffer).
pub const MAX_JSONL_LINE: usize = 16 * 1024 * 1024;
/// How the errors of a record over a format's size limit end (the writer adds the table and
/// the row's key to them).
pub const RECORD_LIMIT: &str = "limit laredo can read";
/// laredo's protobuf per-record read limit (protodelim default).
pub const MAX_PROTOBUF_RECORD: usize = 4 * 1024 * 1024;
/// What larch accepts when reading protobuf (more than it ever writes).
pub const MAX_PROTOBUF_RECORD_READ: usize = 64 * 1024 * 1024;

/// Archive file formats (the names `larch export --format` and the engine config take).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Jsonl,
    Protobuf,
    /// JSONL compressed with zstd.
    #[serde(rename = "jsonl+zstd")]
    JsonlZstd,
}

impl Format {
    pub const ALL: [Format; 3] = [Format::Jsonl, Format::Protobuf, Format::JsonlZstd];

    pub fn id(self) -> &'static str {
        match self {
            Format::Jsonl => "jsonl",
            Format::Protobuf => "protobuf",
            Format::JsonlZstd => "jsonl+zstd",
        }
    }

    /// Whether each chunk of whole encoded records stands alone (no stream state, such as a
    /// compressed frame, spans chunks): chunks encoded apart may then follow each other in any
    /// order.
    pub fn chunks_stand_alone(self) -> bool {
        !matches!(self, Format::JsonlZstd)
    }

    pub fn extension(self) -> &'static str {
        match self {
            Format::Jsonl => ".jsonl",
            Format::Protobuf => ".pb",
            Format::JsonlZstd => ".jsonl.zst",
        }
    }

    pub fn parse(id: &str) -> Result<Format> {
        Format::ALL
            .into_iter()
            .find(|f| f.id() == id)
            .ok_or_else(|| {
                ArchiveError::Invalid(format!(
                    "unknown format {id:?} (known: jsonl, protobuf, jsonl+zstd)"
                ))
            })
    }

    /// Parses a comma-separated list, keeping order.
    pub fn parse_list(ids: &str) -> Result<Vec<Format>> {
        let list: Vec<Format> = ids
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(Format::parse)
            .collect::<Result<_>>()?;
        if list.is_empty() {
            return Err(ArchiveError::Invalid(
                "at least one format is required".into(),
            ));
        }
        Ok(list)
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// Encodes records of one artifact. Call `take` now and then to drain encoded bytes.
pub struct Encoder {
    format: Format,
    buf: Vec<u8>,
    zstd: Option<zstd::stream::write::Encoder<'static, Vec<u8>>>,
    records: u64,
}

impl Encoder {
    pub fn new(format: Format) -> Result<Encoder> {
        let zstd = match format {
            Format::JsonlZstd => Some(
                zstd::stream::write::Encoder::new(Vec::new(), 3)
                    .map_err(|e| ArchiveError::io("starting zstd encoder", e))?,
            ),
            _ => None,
        };
        Ok(Encoder {
            format,
            buf: Vec::with_capacity(64 * 1024),
            zstd,
            records: 0,
        })
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn records(&self) -> u64 {
        self.records
    }

    pub fn row(&mut self, row: &Row) -> Result<()> {
        match self.format {
            Format::Jsonl | Format::JsonlZstd => jsonl::encode_row(&mut self.buf, row)?,
            Format::Protobuf => protobuf::encode_row(&mut self.buf, row)?,
        }
        self.records += 1;
        self.compress()
    }

    pub fn change(&mut self, change: &Change) -> Result<()> {
        match self.format {
            Format::Jsonl | Format::JsonlZstd => jsonl::encode_change(&mut self.buf, change)?,
            Format::Protobuf => protobuf::encode_change(&mut self.buf, change)?,
        }
        self.records += 1;
        self.compress()
    }

    fn compress(&mut self) -> Result<()> {
        if let Some(z) = &mut self.zstd {
            use std::io::Write;
            z.write_all(&self.buf)
                .map_err(|e| ArchiveError::io("zstd compression", e))?;
            self.buf.clear();
        }
        Ok(())
    }

    /// Bytes encoded so far and not yet taken.
    pub fn pending(&self) -> usize {
        match &self.zstd {
            Some(z) => z.get_ref().len(),
            None => self.buf.len(),
        }
    }

    pub fn take(&mut self) -> Vec<u8> {
        match &mut self.zstd {
            Some(z) => std::mem::take(z.get_mut()),
            None => std::mem::take(&mut self.buf),
        }
    }

    pub fn finish(mut self) -> Result<Vec<u8>> {
        match self.zstd.take() {
            Some(z) => z
                .finish()
                .map_err(|e| ArchiveError::io("finishing zstd stream", e)),
            None => Ok(self.buf),
        }
    }
}

/// A decoded snapshot row with its identity (computed during the same scan for JSONL).
pub struct DecodedRow {
    pub row: Row,
    pub identity: Option<Identity>,
}

/// Wraps the raw object stream with the format's framing/decompression.
pub fn framed_reader<'a>(
    format: Format,
    key: &str,
    raw: impl Read + 'a,
) -> Result<Box<dyn BufRead + 'a>> {
    match format {
        Format::JsonlZstd => {
            let dec = zstd::stream::read::Decoder::new(raw).map_err(|e| ArchiveError::Corrupt {
                key: key.to_string(),
                detail: format!("zstd: {e}"),
            })?;
            Ok(Box::new(std::io::BufReader::with_capacity(1 << 20, dec)))
        }
        _ => Ok(Box::new(std::io::BufReader::with_capacity(1 << 20, raw))),
    }
}

/// Streams the rows of a snapshot artifact.
pub fn decode_rows<'a>(
    format: Format,
    key: &'a str,
    reader: Box<dyn BufRead + 'a>,
    key_fields: &'a [String],
) -> Box<dyn Iterator<Item = Result<DecodedRow>> + 'a> {
    match format {
        Format::Jsonl | Format::JsonlZstd => {
            Box::new(jsonl::RowDecoder::new(key, reader, key_fields))
        }
        Format::Protobuf => Box::new(protobuf::RowDecoder::new(key, reader, key_fields)),
    }
}

/// Calls `f` with the JSON text of every row of a snapshot artifact, *not validated* as a JSON
/// object (JSONL lines as they are; protobuf rows as decoded): for a caller that parses every
/// row itself, which spares the decoder's parse.
pub fn for_each_row_text<'a>(
    format: Format,
    key: &'a str,
    reader: Box<dyn BufRead + 'a>,
    mut f: impl FnMut(&str) -> Result<()>,
) -> Result<()> {
    match format {
        Format::Jsonl | Format::JsonlZstd => {
            let mut lines = jsonl::LineReader::new(key, reader);
            while let Some(line) = lines.next_line()? {
                f(line)?;
            }
        }
        Format::Protobuf => {
            for row in protobuf::RowDecoder::new(key, reader, &[]) {
                f(row?.row.as_str())?;
            }
        }
    }
    Ok(())
}

/// Streams the changes of a diff artifact.
pub fn decode_changes<'a>(
    format: Format,
    key: &'a str,
    reader: Box<dyn BufRead + 'a>,
) -> Box<dyn Iterator<Item = Result<Change>> + 'a> {
    match format {
        Format::Jsonl | Format::JsonlZstd => Box::new(jsonl::ChangeDecoder::new(key, reader)),
        Format::Protobuf => Box::new(protobuf::ChangeDecoder::new(key, reader)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row_texts(format: Format, bytes: Vec<u8>) -> Vec<String> {
        let framed = framed_reader(format, "k", std::io::Cursor::new(bytes)).unwrap();
        let mut seen = Vec::new();
        for_each_row_text(format, "k", framed, |text| {
            seen.push(text.to_string());
            Ok(())
        })
        .unwrap();
        seen
    }

    /// Every format hands on each row's JSON text as encoded, in order.
    #[test]
    fn row_texts_of_every_format() {
        let rows = [
            Row::parse(r#"{"a":"x\"y","id":1}"#).unwrap(),
            Row::parse(r#"{"id":2,"n":["é",{"b":null}],"t":true}"#).unwrap(),
        ];
        for format in [Format::Jsonl, Format::JsonlZstd, Format::Protobuf] {
            let mut encoder = Encoder::new(format).unwrap();
            for r in &rows {
                encoder.row(r).unwrap();
            }
            let texts = row_texts(format, encoder.finish().unwrap());
            let parsed: Vec<Row> = texts.iter().map(|t| Row::parse(t).unwrap()).collect();
            let got: Vec<&str> = parsed.iter().map(Row::as_str).collect();
            let want: Vec<&str> = rows.iter().map(Row::as_str).collect();
            assert_eq!(got, want, "{}", format.id());
        }
        // Not validated: a JSONL line that is not a JSON object is the caller's to reject.
        let texts = row_texts(Format::Jsonl, b"{\"a\":1}\n\n[not json\n".to_vec());
        assert_eq!(texts, ["{\"a\":1}", "[not json"]);
    }
}
