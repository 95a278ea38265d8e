//! Column transforms applied by the exporter to every row before it is encoded (masked dev
//! seeds): `keep`, `null`, `redact: <constant>`, `drop`, and `hash` (keyed, deterministic and
//! format-preserving). Rules come from a YAML file (`larch export --transform`) or an
//! ArchiveExport's `spec.transform`; they are checked against the table's columns before
//! anything is exported ([`TransformRules::compile`]).
//!
//! `hash` is keyed with HMAC-SHA-256 and never takes the table into account, so the same value
//! gives the same output in every table and every run: foreign keys still join and a hashed
//! primary key still identifies its row across snapshot and diffs. Integers are permuted
//! (a keyed Feistel network, bijective within the column's range and sign), so hashed integer
//! keys never collide; uuids stay uuids; text keeps its length and its shape (letters stay
//! letters of the same case, digits stay digits, punctuation stays), so an email stays a valid
//! `local@domain` (the domain hashed on its own, so one domain stays one domain). `fake`
//! replaces a text value by a realistic one (a name, an email, a phone number, an address)
//! picked by the same keyed hash, so it is as deterministic ([`super::fake`]).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use hmac::{Hmac, Mac};
use serde_json::value::RawValue;
use sha2::Sha256;

use crate::export::fake::{FakeKind, Generate};
use larch_archive::masking::TransformRecord;
use larch_archive::model::{ColumnDefinition, TableId};
use larch_archive::value::{Row, Value, raw};
pub use larch_contract::transform_rules::{ColumnRule, TableRules, TransformError, TransformRules};
use larch_core::locks::MutexExt;
use larch_postgres::{ColumnMask, Treatment, write_string};

/// Shortest key accepted (bytes).
pub const MIN_KEY_BYTES: usize = 16;

/// The environment variable holding the hash key when no key file is given.
pub const KEY_ENV: &str = "LARCH_TRANSFORM_KEY";

/// Compiling rules for one table: the exporter's side of [`TransformRules`].
pub trait CompileRules {
    /// Checks `table`'s rules against its columns and key fields and compiles them.
    fn compile(
        &self,
        table: &TableId,
        columns: &[ColumnDefinition],
        key_fields: &[String],
        key: Option<Arc<TransformKey>>,
    ) -> Result<TableTransform, TransformError>;
}

impl CompileRules for TransformRules {
    /// Checks `table`'s rules against its columns and key fields and compiles them. A table
    /// the rules do not name is an error (a transform that does not apply would export raw
    /// rows under the belief that they are masked).
    fn compile(
        &self,
        table: &TableId,
        columns: &[ColumnDefinition],
        key_fields: &[String],
        key: Option<Arc<TransformKey>>,
    ) -> Result<TableTransform, TransformError> {
        let name = table.to_string();
        let Some(rules) = self.tables.get(&name) else {
            let named: Vec<&str> = self.tables.keys().map(String::as_str).collect();
            return err(format!(
                "the transform rules have no entry for table {name} (they name: {}); add one \
                 (`undeclared: keep` keeps every column)",
                if named.is_empty() {
                    "no table".to_string()
                } else {
                    named.join(", ")
                }
            ));
        };
        if let Some(missing) = rules
            .columns
            .keys()
            .find(|c| !columns.iter().any(|d| &d.name == *c))
        {
            let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
            return err(format!(
                "transform of table {name}: column {missing:?} does not exist (columns: {})",
                names.join(", ")
            ));
        }
        let mut ops = BTreeMap::new();
        for c in columns {
            let (rule, declared) = match rules.columns.get(&c.name) {
                Some(r) => (r, true),
                None => (&rules.undeclared, false),
            };
            let what = if declared { "" } else { " (undeclared)" };
            if key_fields.contains(&c.name)
                && matches!(
                    rule,
                    ColumnRule::Null
                        | ColumnRule::Drop
                        | ColumnRule::Redact(_)
                        | ColumnRule::Fake(_)
                )
            {
                let fix = if declared {
                    "use hash or keep"
                } else {
                    "name it in `columns` with hash or keep (`undeclared` defaults to null)"
                };
                return err(format!(
                    "transform of table {name}: column {:?}{what} is a key field; `{}` would give \
                     every row the same identity: {fix}",
                    c.name,
                    rule.name()
                ));
            }
            let op = Op::compile(rule, c, key.as_ref()).map_err(|why| {
                TransformError(format!(
                    "transform of table {name}: column {:?}{what}: {why}",
                    c.name
                ))
            })?;
            ops.insert(c.name.clone(), op);
        }
        // A field the validated columns did not have (a column added since) is never kept raw
        // unless the table keeps undeclared columns; a hash needs the type, so it is nulled.
        let unknown = match &rules.undeclared {
            ColumnRule::Keep => Op::Keep,
            ColumnRule::Drop => Op::Drop,
            ColumnRule::Redact(v) => Op::Redact(raw(v.to_string())),
            ColumnRule::Null | ColumnRule::Hash | ColumnRule::Fake(_) => Op::Null,
        };
        let uses_key = ops
            .values()
            .any(|o| matches!(o, Op::Hash(..) | Op::Fake(..)));
        let record = TransformRecord {
            key_id: uses_key
                .then(|| key.as_ref().map(|k| k.id.clone()))
                .flatten(),
            hash: uses_key.then(|| HASH_ALGORITHM.to_string()),
            undeclared: rules.undeclared.record_name(),
            columns: columns
                .iter()
                .map(|c| {
                    let r = rules.columns.get(&c.name).unwrap_or(&rules.undeclared);
                    (c.name.clone(), r.record_name())
                })
                .collect(),
            undeclared_columns: columns
                .iter()
                .filter(|c| !rules.columns.contains_key(&c.name))
                .map(|c| c.name.clone())
                .collect(),
        };
        let identity = ops.values().all(|o| matches!(o, Op::Keep)) && matches!(unknown, Op::Keep);
        Ok(TableTransform {
            table: table.clone(),
            ops,
            unknown,
            identity,
            record,
        })
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, TransformError> {
    Err(TransformError(msg.into()))
}

/// The hash key: HMAC-SHA-256 keyed once (clones reuse the keyed state), and its fingerprint.
pub struct TransformKey {
    mac: Hmac<Sha256>,
    /// `hmac-sha256:` and the first 8 bytes of HMAC(key, "larch transform key id"), in hex.
    id: String,
    /// The Feistel rounds' SipHash keys, derived from the key.
    rounds: [(u64, u64); FEISTEL_ROUNDS],
}

impl fmt::Debug for TransformKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TransformKey({})", self.id)
    }
}

/// Rounds of the integer permutation (as FF3-1's Feistel network).
const FEISTEL_ROUNDS: usize = 8;

/// The hash algorithm's version, recorded in the manifest (`transform.hash`). Another version
/// hashes values differently, so a change starts a new epoch, as a new key does. Version 1
/// (unrecorded) permuted integers with SHA-256 rounds; 2 with SipHash rounds over exactly the
/// type's bits; text, uuid and fake are HMAC-SHA-256 in both.
pub const HASH_ALGORITHM: &str = "larch-hash-2";

impl TransformKey {
    /// A key from its bytes (`origin` names the file or variable in errors). Surrounding
    /// whitespace is ignored, so a Secret written with a trailing newline keeps its id.
    pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<TransformKey, TransformError> {
        let trimmed = bytes.trim_ascii();
        if trimmed.len() < MIN_KEY_BYTES {
            return err(format!(
                "the transform key {origin} has {} byte(s); at least {MIN_KEY_BYTES} are needed",
                trimmed.len()
            ));
        }
        let mac = Hmac::<Sha256>::new_from_slice(trimmed).expect("HMAC takes any key length");
        let tag = |label: &[u8]| -> [u8; 32] {
            let mut m = mac.clone();
            m.update(label);
            m.finalize().into_bytes().into()
        };
        let id = format!(
            "hmac-sha256:{}",
            hex::encode(&tag(b"larch transform key id")[..8])
        );
        let mut rounds = [(0u64, 0u64); FEISTEL_ROUNDS];
        for (i, r) in rounds.iter_mut().enumerate() {
            let t = tag(format!("larch feistel v2 round {i}").as_bytes());
            let word = |at: usize| u64::from_le_bytes(t[at..at + 8].try_into().expect("8 bytes"));
            *r = (word(0), word(8));
        }
        Ok(TransformKey { mac, id, rounds })
    }

    /// The key from `file`, else from `LARCH_TRANSFORM_KEY`; None when neither is set.
    pub fn load(file: Option<&Path>) -> Result<Option<TransformKey>, TransformError> {
        if let Some(path) = file {
            let bytes = std::fs::read(path).map_err(|e| {
                TransformError(format!(
                    "reading --transform-key-file {}: {e}",
                    path.display()
                ))
            })?;
            return Self::from_bytes(&bytes, &format!("file {}", path.display())).map(Some);
        }
        match std::env::var_os(KEY_ENV) {
            Some(v) => Self::from_bytes(v.as_encoded_bytes(), &format!("in ${KEY_ENV}")).map(Some),
            None => Ok(None),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The keyed hash deciding whether a row is in a sample ([`super::subset`]).
    pub(crate) fn sample_tag(&self, value: &[u8]) -> [u8; 32] {
        self.tag(b"sample", value)
    }

    fn tag(&self, domain: &[u8], value: &[u8]) -> [u8; 32] {
        let mut m = self.mac.clone();
        m.update(domain);
        m.update(&[0]);
        m.update(value);
        m.finalize().into_bytes().into()
    }

    /// `n` bytes of keyed output for `value`: the tag, then HMAC(tag ‖ block) for more.
    fn stream(&self, domain: &[u8], value: &[u8], n: usize) -> Vec<u8> {
        let first = self.tag(domain, value);
        let mut out = first.to_vec();
        let mut block = 1u32;
        while out.len() < n {
            out.extend_from_slice(&self.tag(&first, &block.to_be_bytes()));
            block += 1;
        }
        out.truncate(n);
        out
    }

    /// One Feistel round's function: SipHash-2-4 (a keyed PRF made for short inputs) under
    /// the round's key, over the width and the half.
    fn round(&self, round: usize, width: u32, half: u64) -> u64 {
        use std::hash::Hasher as _;
        let (k0, k1) = self.rounds[round];
        let mut h = siphasher::sip::SipHasher24::new_with_keys(k0, k1);
        h.write_u32(width);
        h.write_u64(half);
        h.finish()
    }

    /// A keyed permutation of `[0, 2^bits)` (bits: 15, 31, 63): an unbalanced Feistel network
    /// over exactly `bits` bits, its halves (`bits / 2` and the rest) trading sizes every
    /// round, so every output is in range at once (no cycle walking).
    fn permute(&self, value: u64, bits: u32) -> u64 {
        let mask = |n: u32| (1u64 << n) - 1;
        let (mut a_bits, mut b_bits) = (bits / 2, bits - bits / 2);
        let (mut a, mut b) = (value >> b_bits, value & mask(b_bits));
        for i in 0..FEISTEL_ROUNDS {
            // (a, b) → (b, a ⊕ F(b)): invertible, and the sizes swap.
            let f = self.round(i, bits, b) & mask(a_bits);
            (a, b) = (b, a ^ f);
            (a_bits, b_bits) = (b_bits, a_bits);
        }
        (a << b_bits) | b
    }
}

/// A compiled column transform.
#[derive(Clone, Debug)]
enum Op {
    Keep,
    Null,
    Drop,
    Redact(Value),
    Hash(Arc<TransformKey>, HashFormat),
    /// A fake of this kind, at most this many characters (0: no limit).
    Fake(Arc<TransformKey>, FakeKind, i64),
}

/// How a hash keeps a column's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HashFormat {
    /// A signed integer of this many bits (16, 32, 64), permuted within its sign.
    Int(u32),
    Uuid,
    Text,
}

impl HashFormat {
    fn of(c: &ColumnDefinition) -> Option<HashFormat> {
        match c.type_name.as_str() {
            "int2" => Some(HashFormat::Int(16)),
            "int4" => Some(HashFormat::Int(32)),
            "int8" => Some(HashFormat::Int(64)),
            "uuid" => Some(HashFormat::Uuid),
            "text" | "varchar" | "bpchar" | "name" | "citext" => Some(HashFormat::Text),
            _ => None,
        }
    }
}

fn is_int_type(c: &ColumnDefinition) -> bool {
    matches!(c.type_name.as_str(), "int2" | "int4" | "int8")
}

fn is_text_type(c: &ColumnDefinition) -> bool {
    matches!(HashFormat::of(c), Some(HashFormat::Text | HashFormat::Uuid))
}

impl Op {
    fn compile(
        rule: &ColumnRule,
        c: &ColumnDefinition,
        key: Option<&Arc<TransformKey>>,
    ) -> Result<Op, String> {
        let sql_type = if c.sql_type.is_empty() {
            &c.type_name
        } else {
            &c.sql_type
        };
        Ok(match rule {
            ColumnRule::Keep => Op::Keep,
            ColumnRule::Null if !c.nullable => {
                return Err(
                    "null on a NOT NULL column: replaying the archive into PostgreSQL \
                            would fail; use redact, hash or drop"
                        .into(),
                );
            }
            ColumnRule::Null => Op::Null,
            ColumnRule::Drop => Op::Drop,
            ColumnRule::Redact(v) => {
                let fits = match v {
                    serde_json::Value::Null => c.nullable,
                    serde_json::Value::Number(n) if is_int_type(c) => n.is_i64(),
                    _ if is_int_type(c) => false,
                    serde_json::Value::String(s) if is_text_type(c) => {
                        c.max_length <= 0 || s.chars().count() as i64 <= c.max_length
                    }
                    _ if is_text_type(c) => false,
                    _ => true,
                };
                if !fits {
                    return Err(format!(
                        "redact constant {v} does not fit the type {sql_type}"
                    ));
                }
                Op::Redact(raw(v.to_string()))
            }
            ColumnRule::Hash => {
                let Some(format) = HashFormat::of(c) else {
                    return Err(format!(
                        "hash cannot keep the type {sql_type} (it preserves text, varchar, \
                         char, uuid, smallint, integer and bigint): use null, redact or drop"
                    ));
                };
                let Some(key) = key else {
                    return Err(format!(
                        "hash needs a key: --transform-key-file FILE or ${KEY_ENV} (on \
                         Kubernetes spec.transform.keySecretRef)"
                    ));
                };
                Op::Hash(key.clone(), format)
            }
            ColumnRule::Fake(kind) => {
                if HashFormat::of(c) != Some(HashFormat::Text) {
                    return Err(format!(
                        "fake makes text; the type {sql_type} is not (text, varchar, char, \
                         name, citext): use hash, null, redact or drop"
                    ));
                }
                if c.max_length > 0 && c.max_length < kind.min_length() {
                    return Err(format!(
                        "a fake {kind} needs at least {} characters; the type {sql_type} holds \
                         {}",
                        kind.min_length(),
                        c.max_length
                    ));
                }
                let Some(key) = key else {
                    return Err(format!(
                        "fake needs a key: --transform-key-file FILE or ${KEY_ENV} (on \
                         Kubernetes spec.transform.keySecretRef)"
                    ));
                };
                Op::Fake(key.clone(), *kind, c.max_length.max(0))
            }
        })
    }

    /// The transformed value, or None when the field is dropped. Errors never quote the value.
    fn apply(&self, value: &RawValue) -> Result<Option<Value>, &'static str> {
        let json = value.get();
        if json == "null" {
            return Ok(match self {
                Op::Drop => None,
                _ => Some(raw("null")),
            });
        }
        match self {
            Op::Keep => return Ok(Some(value.to_owned())),
            Op::Drop => return Ok(None),
            Op::Null => return Ok(Some(raw("null"))),
            Op::Redact(v) => return Ok(Some(v.clone())),
            Op::Hash(..) | Op::Fake(..) => {}
        }
        // Hashes and fakes read the value's text: a string's content, else its JSON (a
        // number); uuids and text must be strings.
        let text: Cow<'_, str> = match json.as_bytes().first() {
            Some(b'"') => serde_json::from_str(json).map_err(|_| "a value is not text")?,
            _ if matches!(self, Op::Hash(_, HashFormat::Uuid | HashFormat::Text)) => {
                return Err("a value is not text");
            }
            _ => Cow::Borrowed(json),
        };
        let mut out = Vec::new();
        self.write_text(&text, &mut out)?;
        Ok(Some(raw(
            String::from_utf8(out).expect("JSON written from UTF-8 text")
        )))
    }

    /// Appends the JSON value of a non-NULL value whose text is `text` (a string's content, an
    /// integer's digits) — the one implementation of each transform, used on rows and by the
    /// baseline encoder on COPY fields alike. `Keep` and `Drop` write nothing: their callers
    /// keep or leave out the field.
    fn write_text(&self, text: &str, out: &mut Vec<u8>) -> Result<(), &'static str> {
        match self {
            Op::Keep | Op::Drop => {}
            Op::Null => out.extend_from_slice(b"null"),
            Op::Redact(v) => out.extend_from_slice(v.get().as_bytes()),
            Op::Hash(key, HashFormat::Int(bits)) => {
                let n: i64 = text.parse().map_err(|_| "a value is not an integer")?;
                use std::io::Write as _;
                write!(out, "{}", hash_int(key, n, *bits)).expect("writing to a Vec cannot fail");
            }
            Op::Hash(key, HashFormat::Uuid) => {
                // Hex digits and dashes: nothing to escape.
                out.push(b'"');
                out.extend_from_slice(hash_uuid(key, text).as_bytes());
                out.push(b'"');
            }
            Op::Hash(key, HashFormat::Text) => write_string(&hash_text(key, text), out),
            Op::Fake(key, kind, max) => {
                let tag = key.tag(b"fake", text.as_bytes());
                write_string(&kind.generate(&tag, *max), out);
            }
        }
        Ok(())
    }
}

/// A keyed permutation of the `bits`-bit signed integers keeping the sign: non-negative
/// values map onto `[0, 2^(bits-1))`, negative ones onto `[-2^(bits-1), 0)`.
fn hash_int(key: &TransformKey, n: i64, bits: u32) -> i64 {
    let magnitude_bits = bits - 1;
    if n >= 0 {
        key.permute(n as u64, magnitude_bits) as i64
    } else {
        // -1 → 0, -2 → 1, …, the most negative value → the largest magnitude.
        let m = (-(n + 1)) as u64;
        -(key.permute(m, magnitude_bits) as i64) - 1
    }
}

/// A uuid from the keyed hash of the value's canonical (lowercase) text, version 4 bits set.
fn hash_uuid(key: &TransformKey, value: &str) -> String {
    // PostgreSQL writes uuids in lowercase, so the copy is only for text from elsewhere.
    let canonical = if value.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(value.to_ascii_lowercase())
    } else {
        Cow::Borrowed(value)
    };
    let t = key.tag(b"uuid", canonical.as_bytes());
    let mut b: [u8; 16] = t[..16].try_into().expect("16 bytes");
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let mut text = *b"00000000-0000-0000-0000-000000000000";
    for (bytes, at) in [(0..4, 0), (4..6, 9), (6..8, 14), (8..10, 19), (10..16, 24)] {
        let digits = 2 * bytes.len();
        hex::encode_to_slice(&b[bytes], &mut text[at..at + digits]).expect("two digits a byte");
    }
    String::from_utf8(text.to_vec()).expect("hex digits and dashes")
}

/// Text of the same length and shape; an email (`local@domain`) keeps that shape, its domain
/// hashed on its own (its last label, the TLD, kept).
fn hash_text(key: &TransformKey, value: &str) -> String {
    if let Some((local, domain)) = value.split_once('@')
        && !local.is_empty()
        && !domain.is_empty()
        && !domain.contains('@')
    {
        let local = shape(
            local,
            &key.stream(b"email-local", value.as_bytes(), local.len()),
        );
        let (labels, tld) = match domain.rsplit_once('.') {
            Some((labels, tld)) if !labels.is_empty() => (labels, Some(tld)),
            _ => (domain, None),
        };
        let labels = shape(
            labels,
            &key.stream(
                b"email-domain",
                domain.to_ascii_lowercase().as_bytes(),
                labels.len(),
            ),
        );
        return match tld {
            Some(tld) => format!("{local}@{labels}.{tld}"),
            None => format!("{local}@{labels}"),
        };
    }
    shape(value, &key.stream(b"text", value.as_bytes(), value.len()))
}

/// Replaces each letter by a letter of the same case and each digit by a digit, chosen by
/// `bytes` (one per character); other characters stay (so separators keep the shape).
fn shape(value: &str, bytes: &[u8]) -> String {
    let mut out = String::with_capacity(value.len());
    for (c, b) in value
        .chars()
        .zip(bytes.iter().copied().chain(std::iter::repeat(0)))
    {
        out.push(if c.is_ascii_uppercase() {
            (b'A' + b % 26) as char
        } else if c.is_ascii_digit() {
            (b'0' + b % 10) as char
        } else if c.is_alphabetic() {
            (b'a' + b % 26) as char
        } else {
            c
        });
    }
    out
}

/// One table's compiled transform: applied by the exporter at [`TableTransform::apply`], the
/// single point every row passes through before it is buffered or encoded.
#[derive(Debug)]
pub struct TableTransform {
    table: TableId,
    ops: BTreeMap<String, Op>,
    /// For a field the validated columns did not have.
    unknown: Op,
    /// Every column kept: rows pass unchanged.
    identity: bool,
    record: TransformRecord,
}

impl TableTransform {
    /// What the manifest records.
    pub fn record(&self) -> &TransformRecord {
        &self.record
    }

    pub fn table(&self) -> &TableId {
        &self.table
    }

    /// The columns as the archive has them: dropped ones removed.
    pub fn columns(&self, columns: &[ColumnDefinition]) -> Vec<ColumnDefinition> {
        columns
            .iter()
            .filter(|c| !matches!(self.ops.get(&c.name).unwrap_or(&self.unknown), Op::Drop))
            .cloned()
            .collect()
    }

    /// The row as it may leave the database. Errors name the table and column, never a value.
    pub fn apply(&self, row: Row) -> Result<Row, TransformError> {
        if self.identity {
            return Ok(row);
        }
        let fields = row.field_list().map_err(|e| {
            TransformError(format!(
                "transform of table {}: a row is not a JSON object: {e}",
                self.table
            ))
        })?;
        // In the row's key order: the output needs no sorting, nor a second parse.
        let mut out: Vec<(&str, Cow<'_, RawValue>)> = Vec::with_capacity(fields.len());
        for (name, value) in &fields {
            let op = self.ops.get(name.as_ref()).unwrap_or(&self.unknown);
            let v = match op {
                Op::Keep => Some(Cow::Borrowed(*value)),
                _ => op
                    .apply(value)
                    .map_err(|why| {
                        TransformError(format!(
                            "transform of table {}: column {name:?}: {why}",
                            self.table
                        ))
                    })?
                    .map(Cow::Owned),
            };
            if let Some(v) = v {
                out.push((name, v));
            }
        }
        Ok(Row::from_sorted_fields(
            out.iter().map(|(name, value)| (*name, value.get())),
        ))
    }

    /// [`Self::apply`] on an optional row (the `old` and `new` sides of a change).
    pub fn apply_opt(&self, row: Option<Row>) -> Result<Option<Row>, TransformError> {
        row.map(|r| self.apply(r)).transpose()
    }
}

/// A table's transform for the columns of one baseline, in their order: what the baseline
/// encoder does to each COPY field ([`ColumnMask`]), so its rows are masked as they are
/// written, with the same ops as [`TableTransform::apply`].
pub struct BaselineMask {
    table: TableId,
    columns: Vec<(String, Op)>,
}

impl TableTransform {
    /// The mask for a baseline of `columns`; None when the transform keeps every column.
    pub fn baseline_mask(&self, columns: &[ColumnDefinition]) -> Option<BaselineMask> {
        if self.identity {
            return None;
        }
        Some(BaselineMask {
            table: self.table.clone(),
            columns: columns
                .iter()
                .map(|c| {
                    let op = self.ops.get(&c.name).unwrap_or(&self.unknown);
                    (c.name.clone(), op.clone())
                })
                .collect(),
        })
    }
}

/// `column` indexes the baseline's columns, the ones the mask was made for.
impl ColumnMask for BaselineMask {
    fn treatment(&self, column: usize) -> Treatment {
        match &self.columns[column].1 {
            Op::Keep => Treatment::Keep,
            Op::Drop => Treatment::Drop,
            _ => Treatment::Rewrite,
        }
    }

    fn write(&self, column: usize, text: Option<&str>, out: &mut Vec<u8>) -> Result<(), String> {
        let (name, op) = &self.columns[column];
        match text {
            None => out.extend_from_slice(b"null"),
            Some(text) => op.write_text(text, out).map_err(|why| {
                format!("transform of table {}: column {name:?}: {why}", self.table)
            })?,
        }
        Ok(())
    }
}

/// An export's masking: its rules and key, and the transform compiled for the table's columns
/// as of the current epoch (recompiled with each baseline, so a column added later goes
/// through the undeclared policy from its first row).
#[derive(Debug)]
pub struct Masking {
    rules: TransformRules,
    key: Option<Arc<TransformKey>>,
    current: Mutex<Option<Arc<TableTransform>>>,
}

impl Masking {
    /// Checks that a key is there when a rule hashes.
    pub fn new(
        rules: TransformRules,
        key: Option<TransformKey>,
    ) -> Result<Masking, TransformError> {
        if rules.hashes() && key.is_none() {
            return err(format!(
                "the transform rules hash columns but no key was given: --transform-key-file \
                 FILE or ${KEY_ENV} (on Kubernetes spec.transform.keySecretRef)"
            ));
        }
        Ok(Masking {
            rules,
            key: key.map(Arc::new),
            current: Mutex::new(None),
        })
    }

    /// Compiles the rules for `schema` and makes the result current.
    pub fn compile(
        &self,
        schema: &larch_postgres::TableSchema,
    ) -> Result<Arc<TableTransform>, TransformError> {
        let t = Arc::new(self.rules.compile(
            &schema.id,
            &schema.columns,
            &schema.key_fields,
            self.key.clone(),
        )?);
        *self.current.locked() = Some(t.clone());
        Ok(t)
    }

    /// The transform of the current epoch (None before the first compile).
    pub fn current(&self) -> Option<Arc<TableTransform>> {
        self.current.locked().clone()
    }

    pub fn key_id(&self) -> Option<&str> {
        self.key.as_deref().map(TransformKey::id)
    }

    /// The key (for a sample: the same key decides which rows are kept).
    pub fn key(&self) -> Option<Arc<TransformKey>> {
        self.key.clone()
    }

    pub fn rules(&self) -> &TransformRules {
        &self.rules
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Arc<TransformKey> {
        Arc::new(TransformKey::from_bytes(b"0123456789abcdef-test-key\n", "test").unwrap())
    }

    fn col(name: &str, ty: &str, pk: bool) -> ColumnDefinition {
        ColumnDefinition {
            name: name.into(),
            type_name: ty.into(),
            nullable: !pk,
            primary_key: pk,
            primary_key_ordinal: i64::from(pk),
            ..Default::default()
        }
    }

    fn users() -> Vec<ColumnDefinition> {
        vec![
            col("id", "int8", true),
            col("email", "text", false),
            col("name", "varchar", false),
            col("ssn", "text", false),
            col("note", "text", false),
            col("token", "uuid", false),
            col("born", "date", false),
        ]
    }

    const RULES: &str = r#"
tables:
  public.users:
    columns:
      id: hash
      email: hash
      name: {redact: "REDACTED"}
      ssn: drop
      note: null
      token: hash
  public.orders:
    undeclared: "null"
    columns:
      id: keep
      user_id: hash
"#;

    fn users_transform() -> TableTransform {
        let rules = TransformRules::parse(RULES, "test.yaml").unwrap();
        rules
            .compile(
                &TableId::new("public", "users"),
                &users(),
                &["id".into()],
                Some(key()),
            )
            .unwrap()
    }

    #[test]
    fn every_transform_applies_to_its_column() {
        let t = users_transform();
        let row = Row::parse(
            r#"{"id":42,"email":"alice.smith@example.com","name":"Alice","ssn":"123-45-6789","note":"private","token":"6F9619FF-8B86-D011-B42D-00CF4FC964FF","born":"1990-01-02"}"#,
        )
        .unwrap();
        let out = t.apply(row.clone()).unwrap();
        let m = out.to_map();
        assert!(!m.contains_key("ssn"), "{out:?}");
        assert_eq!(m["note"].get(), "null");
        assert_eq!(m["name"].get(), r#""REDACTED""#);
        assert_eq!(m["born"].get(), "null", "undeclared is null by default");
        let kept = TransformRules::parse(
            &RULES.replace(
                "  public.users:\n",
                "  public.users:\n    undeclared: keep\n",
            ),
            "test.yaml",
        )
        .unwrap()
        .compile(
            &TableId::new("public", "users"),
            &users(),
            &["id".into()],
            Some(key()),
        )
        .unwrap();
        let kept_row = kept.apply(row.clone()).unwrap();
        assert_eq!(
            kept_row.to_map()["born"].get(),
            r#""1990-01-02""#,
            "undeclared: keep"
        );
        assert_eq!(kept.record().undeclared, "keep");
        assert!(
            kept.record()
                .undeclared_columns
                .contains(&"born".to_string())
        );
        let id: i64 = m["id"].get().parse().unwrap();
        assert_ne!(id, 42);
        assert!(id >= 0);
        let email: String = serde_json::from_str(m["email"].get()).unwrap();
        assert_ne!(email, "alice.smith@example.com");
        let (local, domain) = email.split_once('@').unwrap();
        assert_eq!(local.len(), "alice.smith".len());
        assert_eq!(&local[5..6], ".");
        assert!(
            domain.ends_with(".com") && domain.len() == "example.com".len(),
            "{email}"
        );
        let token: String = serde_json::from_str(m["token"].get()).unwrap();
        assert_eq!(token.len(), 36);
        assert_eq!(&token[14..15], "4", "version 4: {token}");
        assert!(!token.eq_ignore_ascii_case("6F9619FF-8B86-D011-B42D-00CF4FC964FF"));
        // Deterministic: the same row gives the same output.
        assert_eq!(t.apply(row).unwrap(), out);
        // Columns: the dropped one is gone; the record names every column's transform.
        let cols = t.columns(&users());
        assert!(!cols.iter().any(|c| c.name == "ssn"));
        assert_eq!(cols.len(), users().len() - 1);
        let rec = t.record();
        assert_eq!(rec.columns["ssn"], "drop");
        assert_eq!(rec.columns["born"], "null");
        assert_eq!(
            rec.undeclared_columns,
            ["born"],
            "the columns the rules did not name"
        );
        assert!(
            rec.uncovered(["id", "born", "later"]).is_empty(),
            "undeclared: null covers"
        );
        assert_eq!(
            kept.record().uncovered(["id", "born", "later"]),
            ["born", "later"]
        );
        assert_eq!(rec.columns["name"], "redact");
        assert_eq!(rec.key_id.as_deref(), Some(key().id()));
        assert!(rec.masks_anything());
        // NULL stays NULL.
        let nulls = t
            .apply(Row::parse(r#"{"id":1,"email":null}"#).unwrap())
            .unwrap();
        assert_eq!(nulls.get("email").unwrap().get(), "null");
    }

    #[test]
    fn the_same_value_hashes_alike_in_two_tables() {
        let rules = TransformRules::parse(RULES, "test.yaml").unwrap();
        let users = users_transform();
        let orders = rules
            .compile(
                &TableId::new("public", "orders"),
                &[
                    col("id", "int8", true),
                    col("user_id", "int8", false),
                    col("total", "numeric", false),
                ],
                &["id".into()],
                Some(key()),
            )
            .unwrap();
        let u = users.apply(Row::parse(r#"{"id":7}"#).unwrap()).unwrap();
        let o = orders
            .apply(Row::parse(r#"{"id":1,"user_id":7,"total":"9.50"}"#).unwrap())
            .unwrap();
        assert_eq!(u.get("id").unwrap().get(), o.get("user_id").unwrap().get());
        assert_eq!(o.get("id").unwrap().get(), "1", "kept");
        assert_eq!(o.get("total").unwrap().get(), "null", "undeclared: null");
        // A field the validated columns lacked (a column added later) is masked too.
        let later = orders
            .apply(Row::parse(r#"{"id":1,"secret":"raw"}"#).unwrap())
            .unwrap();
        assert_eq!(later.get("secret").unwrap().get(), "null");
        // Another key gives other outputs, and another id.
        let other = Arc::new(TransformKey::from_bytes(b"another key of 16+ bytes", "t").unwrap());
        assert_ne!(other.id(), key().id());
        assert_ne!(hash_int(&other, 7, 64), hash_int(&key(), 7, 64));
    }

    /// Known answers: a hashed value changes only with the key or with [`HASH_ALGORITHM`]
    /// (whose change starts a new epoch). Text, uuid and fake are as in version 1.
    #[test]
    fn hashed_values_are_pinned_to_the_algorithm_version() {
        let k = key();
        assert_eq!(HASH_ALGORITHM, "larch-hash-2");
        let got = (
            hash_int(&k, 42, 64),
            hash_int(&k, -7, 32),
            hash_int(&k, 3, 16),
            hash_text(&k, "alice.smith@example.com"),
            hash_uuid(&k, "6F9619FF-8B86-D011-B42D-00CF4FC964FF"),
            FakeKind::City.generate(&k.tag(b"fake", b"tenant-1"), 0),
        );
        let pinned = (
            5516571728129393280,
            -132412500,
            25013,
            "mpiqx.eiyrz@syjuapn.com".to_string(),
            "e1121f3a-998d-4c11-be0c-48c99ec827f0".to_string(),
            "Shelby".to_string(),
        );
        assert_eq!(got, pinned);
    }

    #[test]
    fn integers_are_permuted_within_their_range_and_sign() {
        let k = key();
        // int2: every non-negative value maps into range, no two alike (a permutation).
        let mut seen = std::collections::HashSet::new();
        for n in 0..=i64::from(i16::MAX) {
            let h = hash_int(&k, n, 16);
            assert!((0..=i64::from(i16::MAX)).contains(&h), "{n} -> {h}");
            assert!(seen.insert(h), "collision at {n}");
        }
        for n in [-1, -2, i64::from(i16::MIN)] {
            let h = hash_int(&k, n, 16);
            assert!((i64::from(i16::MIN)..0).contains(&h), "{n} -> {h}");
        }
        for n in [0, 1, 2, i64::from(i32::MAX), -1, i64::from(i32::MIN)] {
            let h = hash_int(&k, n, 32);
            assert!((i64::from(i32::MIN)..=i64::from(i32::MAX)).contains(&h));
            assert_eq!(h >= 0, n >= 0);
        }
        for n in [0, 1, i64::MAX, -1, i64::MIN] {
            let h = hash_int(&k, n, 64);
            assert_eq!(h >= 0, n >= 0, "{n} -> {h}");
            assert_eq!(h, hash_int(&k, n, 64));
        }
        // Different widths are different permutations, each deterministic.
        let distinct: std::collections::HashSet<i64> =
            (1..1000).map(|n| hash_int(&k, n, 32)).collect();
        assert_eq!(distinct.len(), 999);
    }

    #[test]
    fn text_keeps_its_shape() {
        let k = key();
        let h = hash_text(&k, "Ab-12 xy");
        assert_eq!(h.len(), 8);
        let b = h.as_bytes();
        assert!(b[0].is_ascii_uppercase() && b[1].is_ascii_lowercase());
        assert_eq!(b[2], b'-');
        assert!(b[3].is_ascii_digit() && b[4].is_ascii_digit());
        assert_eq!(b[5], b' ');
        assert_ne!(h, "Ab-12 xy");
        assert_eq!(hash_text(&k, "Ab-12 xy"), h);
        // Long text draws more than one block of keyed bytes.
        let long = "x".repeat(100);
        let hl = hash_text(&k, &long);
        assert_eq!(hl.len(), 100);
        assert!(hl.bytes().all(|c| c.is_ascii_lowercase()));
        // One domain stays one domain.
        let (_, d1) = hash_text(&k, "a@corp.io")
            .split_once('@')
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .unwrap();
        let (_, d2) = hash_text(&k, "bob@corp.io")
            .split_once('@')
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .unwrap();
        assert_eq!(d1, d2);
        assert_ne!(d1, "corp.io");
        // uuid: case does not matter, as PostgreSQL compares uuids.
        assert_eq!(
            hash_uuid(&k, "6f9619ff-8b86-d011-b42d-00cf4fc964ff"),
            hash_uuid(&k, "6F9619FF-8B86-D011-B42D-00CF4FC964FF")
        );
    }

    #[test]
    fn fakes_are_deterministic_realistic_and_fit_the_column() {
        let rules = TransformRules::parse(
            r#"
tables:
  public.users:
    columns:
      id: keep
      email: {fake: email}
      name: {fake: full_name}
      note: {fake: city}
  public.contacts:
    columns:
      id: keep
      mail: {fake: email}
      phone: {fake: phone}
"#,
            "fake.yaml",
        )
        .unwrap();
        assert!(rules.hashes(), "a fake needs the key");
        let mut cols = users();
        cols[2].max_length = 12; // name varchar(12): fakes are cut to fit
        let users_t = rules
            .compile(
                &TableId::new("public", "users"),
                &cols,
                &["id".into()],
                Some(key()),
            )
            .unwrap();
        let contacts = rules
            .compile(
                &TableId::new("public", "contacts"),
                &[
                    col("id", "int4", true),
                    col("mail", "varchar", false),
                    col("phone", "text", false),
                ],
                &["id".into()],
                Some(key()),
            )
            .unwrap();
        assert_eq!(users_t.record().columns["email"], "fake:email");
        assert_eq!(users_t.record().key_id.as_deref(), Some(key().id()));
        let row = r#"{"id":1,"email":"alice.smith@corp.io","name":"Alice Smith","note":"x"}"#;
        let u = users_t.apply(Row::parse(row).unwrap()).unwrap();
        let email: String = serde_json::from_str(u.get("email").unwrap().get()).unwrap();
        assert!(
            email.ends_with("@example.com")
                || email.ends_with("@example.org")
                || email.ends_with("@example.net"),
            "{email}"
        );
        assert!(!email.contains("alice.smith@corp"), "{email}");
        let name: String = serde_json::from_str(u.get("name").unwrap().get()).unwrap();
        assert!(
            name.chars().count() <= 12 && name != "Alice Smith",
            "{name}"
        );
        // Same input, same fake: in another table and on another run (a fresh key object).
        let c = contacts
            .apply(
                Row::parse(r#"{"id":9,"mail":"alice.smith@corp.io","phone":"+44 20 7946 0000"}"#)
                    .unwrap(),
            )
            .unwrap();
        assert_eq!(c.get("mail").unwrap().get(), u.get("email").unwrap().get());
        let again = rules
            .compile(
                &TableId::new("public", "users"),
                &cols,
                &["id".into()],
                Some(key()),
            )
            .unwrap()
            .apply(Row::parse(row).unwrap())
            .unwrap();
        assert_eq!(again, u);
        let phone: String = serde_json::from_str(c.get("phone").unwrap().get()).unwrap();
        assert!(
            phone.starts_with("+1 ") && phone.contains("-555-01"),
            "{phone}"
        );
        // Another key, other fakes (for most inputs).
        let other = Arc::new(TransformKey::from_bytes(b"another key of 16+ bytes", "t").unwrap());
        let differ = (0..50)
            .filter(|i| {
                let v = serde_json::value::to_raw_value(&format!("user{i}@corp.io")).unwrap();
                let fake = |k: &Arc<TransformKey>| {
                    Op::Fake(k.clone(), FakeKind::Email, 0)
                        .apply(&v)
                        .unwrap()
                        .unwrap()
                };
                fake(&key()).get() != fake(&other).get()
            })
            .count();
        assert!(differ > 40, "{differ}");
        // NULL stays NULL.
        let n = users_t
            .apply(Row::parse(r#"{"id":2,"email":null}"#).unwrap())
            .unwrap();
        assert_eq!(n.get("email").unwrap().get(), "null");
        // Type fit: a fake only goes into text, and a varchar too short for the kind is refused.
        let compile = |cols: &[ColumnDefinition]| {
            rules
                .compile(
                    &TableId::new("public", "users"),
                    cols,
                    &["id".into()],
                    Some(key()),
                )
                .unwrap_err()
                .to_string()
        };
        let mut short = users();
        short[1].max_length = 10;
        short[1].sql_type = "character varying(10)".into();
        let e = compile(&short);
        assert!(
            e.contains("column \"email\": a fake email needs at least 15 characters; the type character varying(10) holds 10"),
            "{e}"
        );
        let mut int = users();
        int[4].type_name = "int4".into();
        int[4].sql_type = "integer".into();
        let e = compile(&int);
        assert!(
            e.contains("column \"note\": fake makes text; the type integer is not"),
            "{e}"
        );
        let on_key = TransformRules::parse(
            "tables: {public.users: {columns: {id: {fake: city}}}}",
            "f.yaml",
        )
        .unwrap()
        .compile(
            &TableId::new("public", "users"),
            &users(),
            &["id".into()],
            Some(key()),
        )
        .unwrap_err()
        .to_string();
        assert!(
            on_key.contains("column \"id\" is a key field; `fake`"),
            "{on_key}"
        );
        let e = TransformRules::parse(
            "tables: {public.users: {columns: {email: {fake: ssn}}}}",
            "f.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("unknown fake \"ssn\": expected one of first_name, last_name"),
            "{e}"
        );
    }

    #[test]
    fn bad_rules_are_clear_errors() {
        let rules = TransformRules::parse(RULES, "test.yaml").unwrap();
        let table = TableId::new("public", "users");
        let compile = |cols: &[ColumnDefinition], key: Option<Arc<TransformKey>>| {
            rules
                .compile(&table, cols, &["id".into()], key)
                .unwrap_err()
                .to_string()
        };
        let mut cols = users();
        cols.retain(|c| c.name != "email");
        let e = compile(&cols, Some(key()));
        assert!(
            e.contains("table public.users: column \"email\" does not exist"),
            "{e}"
        );
        let mut cols = users();
        cols[1].type_name = "jsonb".into();
        cols[1].sql_type = "jsonb".into();
        let e = compile(&cols, Some(key()));
        assert!(
            e.contains("column \"email\": hash cannot keep the type jsonb"),
            "{e}"
        );
        let e = compile(&users(), None);
        assert!(e.contains("column \"id\": hash needs a key"), "{e}");
        let e = rules
            .compile(&TableId::new("public", "other"), &users(), &[], Some(key()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no entry for table public.other"), "{e}");
        let drop_key =
            TransformRules::parse("tables: {public.users: {columns: {id: drop}}}", "f.yaml")
                .unwrap();
        let e = drop_key
            .compile(&table, &users(), &["id".into()], None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("column \"id\" is a key field; `drop`"), "{e}");
        let e = TransformRules::parse("tables: {public.users: {columns: {id: sha1}}}", "f.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("f.yaml") && e.contains("sha1"), "{e}");
        let e = TransformRules::parse("tables: {users: {}}", "f.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"users\" must be schema.table"), "{e}");
        let bad_redact = TransformRules::parse(
            "tables: {public.users: {columns: {id: {redact: x}}}}",
            "f.yaml",
        )
        .unwrap();
        let e = bad_redact
            .compile(&table, &users(), &[], None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("redact constant \"x\" does not fit the type int8"),
            "{e}"
        );
        let e = TransformKey::from_bytes(b"short\n", "file k")
            .unwrap_err()
            .to_string();
        assert!(e.contains("file k has 5 byte(s)"), "{e}");
    }

    /// A masked baseline row written by the encoder is byte for byte the row the transform
    /// makes of the unmasked one (the path changes take), for every op, NULLs, escapes and a
    /// column the transform was not compiled for (the undeclared policy).
    #[test]
    fn the_encoder_masks_as_the_transform_does() {
        use larch_archive::model::ColumnDefinition;
        use larch_archive::model::TableId;
        use larch_postgres::{TableSchema, encode_copy_lines};
        use std::sync::Arc;
        let col = |name: &str, ty: &str, oid: u32| ColumnDefinition {
            name: name.into(),
            type_name: ty.into(),
            nullable: name != "id",
            primary_key: name == "id",
            type_oid: oid,
            ..Default::default()
        };
        let columns = vec![
            col("id", "int8", 20),
            col("email", "text", 25),
            col("ref", "uuid", 2950),
            col("first", "text", 25),
            col("ssn", "text", 25),
            col("note", "text", 25),
            col("secret", "text", 25),
            col("payload", "jsonb", 3802),
            col("small", "int2", 21),
            col("born", "date", 1082),
            col("added", "text", 25),
        ];
        let rules = TransformRules::parse(
            r#"
tables:
  public.people:
    undeclared: {redact: "gone"}
    columns:
      id: hash
      email: hash
      ref: hash
      first: {fake: first_name}
      ssn: drop
      note: {redact: "REDACTED"}
      secret: null
      payload: keep
      small: hash
      born: keep
"#,
            "test.yaml",
        )
        .unwrap();
        let key = Arc::new(TransformKey::from_bytes(b"0123456789abcdef-test-key", "test").unwrap());
        // Compiled without `added`: a column that appeared after the rules were checked.
        let transform = rules
            .compile(
                &TableId::new("public", "people"),
                &columns[..columns.len() - 1],
                &["id".into()],
                Some(key),
            )
            .unwrap();
        let schema = TableSchema {
            id: TableId::new("public", "people"),
            type_oids: columns.iter().map(|c| c.type_oid).collect(),
            columns,
            type_mods: vec![],
            sql_types: vec![],
            generated: vec![],
            key_fields: vec!["id".into()],
            has_primary_key: true,
            replica_identity: 'd',
        };
        let mask = transform.baseline_mask(&schema.columns).unwrap();
        let lines = [
            "42\talice.smith@example.com\t6f9619ff-8b86-d011-b42d-00cf4fc964ff\tAlice\t123-45-6789\tprivate\ts3cr3t\t{\"a\": 1}\t7\t1990-01-02\tnew",
            "-9223372036854775808\tbob@corp.io\t6F9619FF-8B86-D011-B42D-00CF4FC964FF\tBo\\tb\t000\tx\ty\t[]\t-32768\t2000-02-29\tz",
            "0\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N",
            "9223372036854775807\tno-at-sign \\\\ \"quoted\"\t00000000-0000-0000-0000-000000000000\tÉlodie\t1\t2\t3\tnull\t32767\t2026-12-03\t",
        ];
        let plain = encode_copy_lines(&schema, None, &lines);
        let masked = encode_copy_lines(&schema, Some(Box::new(mask)), &lines);
        for ((line, plain), masked) in lines.iter().zip(plain).zip(masked) {
            let want = transform.apply(plain.unwrap()).unwrap();
            let got = masked.unwrap();
            assert_eq!(got.as_str(), want.as_str(), "line {line:?}");
            assert!(!got.as_str().contains("ssn"), "{got:?}");
        }
        // A hash on a value it cannot read fails naming the table and column, not the value.
        let mask = transform.baseline_mask(&schema.columns).unwrap();
        let bad = ["x1\ta@b.c\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N"];
        let err = encode_copy_lines(&schema, Some(Box::new(mask)), &bad)
            .remove(0)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("public.people") && err.contains("\"id\"") && !err.contains("x1"),
            "{err}"
        );
    }
}
