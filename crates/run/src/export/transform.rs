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
use hash::{hash_int, hash_text, hash_uuid};
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
            return err(no_entry_message(self, &name));
        };
        check_columns_exist(&name, rules, columns)?;
        let mut ops = BTreeMap::new();
        for c in columns {
            let op = compile_column(&name, rules, c, key_fields, key.as_ref())?;
            ops.insert(c.name.clone(), op);
        }
        // A field the validated columns did not have (a column added since) is never kept raw
        // unless the table keeps undeclared columns; a hash needs the type, so it is nulled.
        let unknown = match &rules.undeclared {
            ColumnRule::Keep => Op::Keep,
            ColumnRule::Drop => Op::Drop,
            ColumnRule::Redact(v) => Op::Redact(raw(v.to_string())),
            ColumnRule::Null | ColumnRule::Hash | ColumnRule::Fake(_) | ColumnRule::Permute => {
                Op::Null
            }
        };
        let record = transform_record(rules, columns, &ops, key.as_ref());
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

/// A table the rules do not name: the error lists the tables they do.
fn no_entry_message(rules: &TransformRules, name: &str) -> String {
    let named: Vec<&str> = rules.tables.keys().map(String::as_str).collect();
    format!(
        "the transform rules have no entry for table {name} (they name: {}); add one \
         (`undeclared: keep` keeps every column)",
        if named.is_empty() {
            "no table".to_string()
        } else {
            named.join(", ")
        }
    )
}

/// Every column the rules name must exist in the table.
fn check_columns_exist(
    name: &str,
    rules: &TableRules,
    columns: &[ColumnDefinition],
) -> Result<(), TransformError> {
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
    Ok(())
}

/// Column `c`'s op under its rule (or the undeclared policy). A key field must keep its
/// identity, so only hash, permute or keep apply to it.
fn compile_column(
    name: &str,
    rules: &TableRules,
    c: &ColumnDefinition,
    key_fields: &[String],
    key: Option<&Arc<TransformKey>>,
) -> Result<Op, TransformError> {
    let (rule, declared) = match rules.columns.get(&c.name) {
        Some(r) => (r, true),
        None => (&rules.undeclared, false),
    };
    let what = if declared { "" } else { " (undeclared)" };
    if key_fields.contains(&c.name)
        && matches!(
            rule,
            ColumnRule::Null | ColumnRule::Drop | ColumnRule::Redact(_) | ColumnRule::Fake(_)
        )
    {
        let fix = if declared {
            "use hash, permute or keep"
        } else {
            "name it in `columns` with hash, permute or keep (`undeclared` defaults to null)"
        };
        return err(format!(
            "transform of table {name}: column {:?}{what} is a key field; `{}` would give \
             every row the same identity: {fix}",
            c.name,
            rule.name()
        ));
    }
    Op::compile(rule, c, key).map_err(|why| {
        TransformError(format!(
            "transform of table {name}: column {:?}{what}: {why}",
            c.name
        ))
    })
}

/// What the manifest records of a table's transform: the rule of each column, and the key id
/// and hash version when an op uses the key.
fn transform_record(
    rules: &TableRules,
    columns: &[ColumnDefinition],
    ops: &BTreeMap<String, Op>,
    key: Option<&Arc<TransformKey>>,
) -> TransformRecord {
    let uses_key = ops
        .values()
        .any(|o| matches!(o, Op::Hash(..) | Op::Fake(..) | Op::Permute(..)));
    let permutes = ops.values().any(|o| matches!(o, Op::Permute(..)));
    TransformRecord {
        key_id: uses_key.then(|| key.map(|k| k.id.clone())).flatten(),
        hash: uses_key.then(|| HASH_ALGORITHM.to_string()),
        permute: permutes.then(|| permute::PERMUTE_ALGORITHM.to_string()),
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
        leak_check: None,
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
    /// A keyed format-preserving permutation ([`permute`]): unique in, unique out.
    Permute(Arc<TransformKey>, HashFormat),
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
            ColumnRule::Permute => {
                let format = permute::format_of(c, sql_type)?;
                Op::Permute(permute::key_for(key)?.clone(), format)
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
            Op::Hash(..) | Op::Fake(..) | Op::Permute(..) => {}
        }
        // Hashes and fakes read the value's text: a string's content, else its JSON (a
        // number); uuids and text must be strings.
        let text: Cow<'_, str> = match json.as_bytes().first() {
            Some(b'"') => serde_json::from_str(json).map_err(|_| "a value is not text")?,
            _ if matches!(
                self,
                Op::Hash(_, HashFormat::Uuid | HashFormat::Text)
                    | Op::Permute(_, HashFormat::Uuid | HashFormat::Text)
            ) =>
            {
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
            Op::Permute(key, format) => permute::write(key, *format, text, out)?,
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
    /// The columns of the current epoch the rules do not name (`/status`, and the
    /// ArchiveExport's `UnreviewedColumns` condition).
    unreviewed: crate::review::Unreviewed,
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
            unreviewed: Default::default(),
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
        self.unreviewed.note(&self.rules, schema);
        Ok(t)
    }

    /// The columns of the current epoch the rules do not name.
    pub fn unreviewed(&self) -> Vec<crate::review::UnreviewedColumn> {
        self.unreviewed.current()
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

mod hash;
mod permute;
#[cfg(test)]
mod tests;
