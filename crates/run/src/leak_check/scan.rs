//! Pass 2 of the leak check: every record of the epoch's objects through the filter, on every
//! core. One thread decodes the objects (any format, integrity checked) and hands batches of
//! records, through a bounded queue, to scanner threads that walk each record's JSON without
//! building a tree and look its strings' pieces and its numbers up in the filter.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context;
use larch_archive::ArchiveError;
use larch_archive::manifest::{ArtifactKind, Manifest};
use larch_archive::reader::ArchiveReader;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::filter::{KeyedFilter, pieces};

/// Candidates held at most (each an archive string the filter flagged): past it the check
/// stops with an error rather than grow.
const MAX_CANDIDATES: usize = 1_000_000;
/// Field names kept per candidate (enough to say where a value leaked).
const MAX_FIELDS: usize = 8;
/// Records per batch handed to a scanner, and batches queued at most: what memory holds of the
/// archive at once besides the decoder's buffer.
const BATCH: usize = 256;
const QUEUE: usize = 16;

/// An archive string the filter flagged: how often, and in which fields.
#[derive(Default)]
pub struct Candidate {
    pub occurrences: u64,
    pub fields: BTreeSet<String>,
}

/// What pass 2 found.
#[derive(Default)]
pub struct Scanned {
    pub candidates: HashMap<String, Candidate>,
    pub objects: u64,
    pub records: u64,
}

impl Scanned {
    /// The candidate `text`, added if new (up to [`MAX_CANDIDATES`]).
    fn slot(&mut self, text: &str) -> Result<&mut Candidate, String> {
        if !self.candidates.contains_key(text) {
            if self.candidates.len() >= MAX_CANDIDATES {
                return Err(format!(
                    "more than {MAX_CANDIDATES} distinct strings of the archive match raw \
                     values: the masking leaks at scale (or --min-length is too small)"
                ));
            }
            self.candidates
                .insert(text.to_string(), Candidate::default());
        }
        Ok(self.candidates.get_mut(text).expect("just added"))
    }

    fn add(&mut self, field: &str, text: &str) -> Result<(), String> {
        let c = self.slot(text)?;
        c.occurrences += 1;
        if c.fields.len() < MAX_FIELDS && !c.fields.contains(field) {
            c.fields.insert(field.to_string());
        }
        Ok(())
    }

    fn merge(&mut self, other: Scanned) -> Result<(), String> {
        self.records += other.records;
        for (text, theirs) in other.candidates {
            let c = self.slot(&text)?;
            c.occurrences += theirs.occurrences;
            for field in theirs.fields {
                if c.fields.len() < MAX_FIELDS {
                    c.fields.insert(field);
                }
            }
        }
        Ok(())
    }
}

/// One scanner's state: the filter, and what it flagged.
struct Scanner {
    filter: Arc<KeyedFilter>,
    min_len: usize,
    found: Scanned,
}

impl Scanner {
    /// Looks up every string (its pieces) and number of a record, nested values included.
    fn record(&mut self, json: &str, key: &str) -> Result<(), String> {
        let (filter, min_len, found) = (&*self.filter, self.min_len, &mut self.found);
        let mut full = None;
        let mut look = |field: &str, p: &str| {
            // the filter holds no spelling shorter than min_len characters (nor bytes)
            if p.len() >= min_len
                && filter.may_contain(p)
                && let Err(e) = found.add(field, p)
            {
                full = Some(e);
            }
        };
        for_each_scalar(json, &mut |field, text, is_string| {
            if is_string {
                pieces(text, |p| look(field, p));
            } else {
                look(field, text);
            }
        })
        .map_err(|e| format!("{key}: a record that is not a JSON object: {e}"))?;
        self.found.records += 1;
        full.map_or(Ok(()), Err)
    }

    /// Takes batches from `queue` until it closes.
    fn run(mut self, queue: &Mutex<Receiver<Batch>>) -> Result<Scanned, String> {
        loop {
            let batch = queue.lock().unwrap_or_else(PoisonError::into_inner).recv();
            let Ok(batch) = batch else {
                return Ok(self.found);
            };
            for record in batch.records() {
                self.record(record, &batch.key)?;
            }
        }
    }
}

/// Records of one object, their texts end to end in one buffer (one allocation per batch, not
/// per record).
struct Batch {
    key: Arc<str>,
    text: String,
    ends: Vec<usize>,
}

impl Batch {
    fn new(key: Arc<str>) -> Batch {
        Batch {
            key,
            text: String::with_capacity(BATCH * 256),
            ends: Vec::with_capacity(BATCH),
        }
    }

    fn records(&self) -> impl Iterator<Item = &str> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(self.ends.iter().copied())
            .map(|(a, b)| &self.text[a..b])
    }
}

/// The decoding side: records gathered into batches, sent when full.
struct Sending {
    queue: SyncSender<Batch>,
    batch: Batch,
}

impl Sending {
    fn push(&mut self, record: &str) -> larch_archive::Result<()> {
        self.batch.text.push_str(record);
        self.batch.ends.push(self.batch.text.len());
        if self.batch.ends.len() >= BATCH {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> larch_archive::Result<()> {
        let next = Batch::new(self.batch.key.clone());
        let full = std::mem::replace(&mut self.batch, next);
        self.queue
            .send(full)
            .map_err(|_| ArchiveError::Invalid("the scanners stopped".into()))
    }
}

/// Pass 2: every snapshot and diff of `manifest`'s current epoch through `filter`.
pub async fn scan_archive(
    reader: &ArchiveReader,
    manifest: &Manifest,
    filter: Arc<KeyedFilter>,
    min_len: usize,
) -> anyhow::Result<Scanned> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let (queue, batches) = sync_channel::<Batch>(QUEUE);
    let batches = Arc::new(Mutex::new(batches));
    let scanners: Vec<_> = (0..workers)
        .map(|_| {
            let scanner = Scanner {
                filter: filter.clone(),
                min_len,
                found: Scanned::default(),
            };
            let batches = batches.clone();
            std::thread::spawn(move || scanner.run(&batches))
        })
        .collect();
    let decoded = decode(reader, manifest, queue).await;
    let mut found = Scanned::default();
    let mut scan_error = None;
    for scanner in scanners {
        let joined = tokio::task::spawn_blocking(move || scanner.join())
            .await
            .expect("joining a scanner");
        match joined.expect("a scanner panicked") {
            Ok(part) => {
                if let Err(e) = found.merge(part) {
                    scan_error.get_or_insert(e);
                }
            }
            Err(e) => {
                scan_error.get_or_insert(e);
            }
        }
    }
    // A scanner's error says more than the decoder's "the scanners stopped".
    if let Some(e) = scan_error {
        anyhow::bail!(e);
    }
    found.objects = decoded?;
    Ok(found)
}

/// Decodes every object of the epoch into `queue`; returns how many objects.
async fn decode(
    reader: &ArchiveReader,
    manifest: &Manifest,
    queue: SyncSender<Batch>,
) -> anyhow::Result<u64> {
    let mut objects = 0;
    let mut sending = Sending {
        queue,
        batch: Batch::new(Arc::from("")),
    };
    for artifact in super::epoch_artifacts(manifest) {
        let key = reader.artifact_key(artifact, reader.choose_format(artifact)?.0);
        let what = format!("reading {key}");
        sending.batch.key = Arc::from(key);
        // The scanners parse every record (and say which object one that is not JSON is in):
        // the decoder hands snapshot rows on as text, without a parse of its own.
        sending = match artifact.kind {
            ArtifactKind::Snapshot => {
                reader
                    .fold_row_texts(artifact, sending, |s, text| s.push(text))
                    .await
            }
            ArtifactKind::Diff => {
                reader
                    .fold_changes(artifact, sending, |s, c| {
                        for row in [c.old, c.new].into_iter().flatten() {
                            s.push(row.as_str())?;
                        }
                        Ok(())
                    })
                    .await
            }
        }
        .and_then(|mut s| s.flush().map(|()| s))
        .context(what)?;
        objects += 1;
    }
    Ok(objects)
}

/// Calls `f(field, text, is_string)` for every string and number of a record (a JSON object),
/// at any depth, with the name of the top-level field it is in: strings unescaped (borrowed from
/// `json` when they hold no escape), numbers as serde_json prints them. No tree is built.
pub fn for_each_scalar(
    json: &str,
    f: &mut dyn FnMut(&str, &str, bool),
) -> Result<(), serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(json);
    Record(f).deserialize(&mut de)?;
    de.end()
}

struct Record<'f>(&'f mut dyn FnMut(&str, &str, bool));

impl<'de> DeserializeSeed<'de> for Record<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Record<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(field) = map.next_key_seed(FieldName)? {
            map.next_value_seed(Scalars {
                field: &field,
                f: &mut *self.0,
            })?;
        }
        Ok(())
    }
}

/// A field name, borrowed unless it holds an escape.
struct FieldName;

impl<'de> DeserializeSeed<'de> for FieldName {
    type Value = Cow<'de, str>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for FieldName {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_string()))
    }
}

/// The scalars of one field's value.
struct Scalars<'a> {
    field: &'a str,
    f: &'a mut dyn FnMut(&str, &str, bool),
}

impl<'de> DeserializeSeed<'de> for Scalars<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Scalars<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        (self.f)(self.field, v, true);
        Ok(())
    }
    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        let mut buf = [0u8; 20];
        (self.f)(self.field, integer_text(v, &mut buf), false);
        Ok(())
    }
    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        let mut buf = [0u8; 20];
        (self.f)(self.field, integer_text(v, &mut buf), false);
        Ok(())
    }
    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        if let Some(n) = serde_json::Number::from_f64(v) {
            (self.f)(self.field, &n.to_string(), false);
        }
        Ok(())
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq
            .next_element_seed(Scalars {
                field: self.field,
                f: &mut *self.f,
            })?
            .is_some()
        {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key::<IgnoredAny>()?.is_some() {
            map.next_value_seed(Scalars {
                field: self.field,
                f: &mut *self.f,
            })?;
        }
        Ok(())
    }
}

/// An integer's decimal text, written into `buf` (a record's numbers are not allocated).
fn integer_text(v: impl fmt::Display, buf: &mut [u8; 20]) -> &str {
    use std::io::Write;
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    write!(cursor, "{v}").expect("20 bytes hold any 64-bit integer");
    let len = cursor.position() as usize;
    std::str::from_utf8(&buf[..len]).expect("digits are ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_string_and_number_with_its_top_level_field() {
        let mut seen = Vec::new();
        for_each_scalar(
            r#"{"a":"x\"y","b":[1,-2,{"c":"deep","d":null,"e":true}],"f\u0067":1.50,"h":18446744073709551616}"#,
            &mut |field, text, is_string| seen.push(format!("{field}={text}:{is_string}")),
        )
        .unwrap();
        assert_eq!(
            seen,
            [
                "a=x\"y:true",
                "b=1:false",
                "b=-2:false",
                "b=deep:true",
                "fg=1.5:false",
                "h=1.8446744073709552e+19:false"
            ]
        );
        let mut nothing = |_: &str, _: &str, _: bool| {};
        assert!(for_each_scalar(r#"{"a":"#, &mut nothing).is_err());
        assert!(for_each_scalar("[1]", &mut nothing).is_err());
        assert!(for_each_scalar(r#"{"a":1} x"#, &mut nothing).is_err());
    }

    #[test]
    fn merged_candidates_keep_counts_and_fields() {
        let mut a = Scanned::default();
        a.add("email", "ann@x.org").unwrap();
        a.add("note", "ann@x.org").unwrap();
        a.records = 2;
        let mut b = Scanned::default();
        b.add("note", "ann@x.org").unwrap();
        b.add("bio", "bob@y.org").unwrap();
        b.records = 3;
        a.merge(b).unwrap();
        assert_eq!(a.records, 5);
        let ann = &a.candidates["ann@x.org"];
        assert_eq!(ann.occurrences, 3);
        assert_eq!(
            ann.fields.iter().map(String::as_str).collect::<Vec<_>>(),
            ["email", "note"]
        );
        assert_eq!(a.candidates["bob@y.org"].occurrences, 1);
    }
}
