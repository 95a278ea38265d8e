//! The memory target: an indexed in-memory table served over HTTP.
//!
//! * Primary index: a `BTreeMap` keyed by row identity (rule R4) in a stable total order
//!   (numbers numerically first, then other identities by text), so pagination by cursor is
//!   stable while rows change.
//! * Secondary equality indexes on the configured `index_fields` (canonical value text → the
//!   identities holding it).
//! * A re-baseline builds a whole new table aside and swaps it in under the write lock: a query
//!   sees the old table or the new one, never a partial or empty one (C2).
//! * Rows are emitted as their exact JSON text (every digit of every number), kept packed: one
//!   buffer per row holding its values, the field names once per table (`packed_rows`).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::ops::Bound;
use std::sync::{Arc, Mutex, RwLock};

use async_trait::async_trait;
use base64::Engine as _;
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::value::RawValue;

use super::Target;
use super::packed_rows::{self, PackedRow, Shapes};
use larch_archive::identity::{Identity, KeyCapture, change_identity, identity_of, row_identity};
use larch_archive::model::{Action, ColumnDefinition, TableId};
use larch_archive::source::ChangeEvent;
use larch_archive::value::{
    Row, canonical_text, canonical_text_of, compare_canonical, string_value,
};
use larch_core::locks::{MutexExt, RwLockExt};

/// An identity in the table's order: numbers first (numerically), then the rest by text. A
/// total order (mixing numbers and text by `compare_canonical` alone would not be). Integer
/// identities that fit an `i64` (the common primary key) compare and store without text.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SortKey {
    Int(i64),
    /// Another canonical number (decimal, or beyond `i64`). Boxed twice: a thin pointer
    /// keeps every key (most are `Int`) at 16 bytes in the primary and secondary indexes.
    Num(Box<Box<str>>),
    Text(Box<Box<str>>),
}

fn is_canonical_number(s: &str) -> bool {
    let b = s.strip_prefix('-').unwrap_or(s).as_bytes();
    !b.is_empty()
        && b[0].is_ascii_digit()
        && b.iter().filter(|c| **c == b'.').count() <= 1
        && b.iter().all(|c| c.is_ascii_digit() || *c == b'.')
        && *b.last().unwrap() != b'.'
}

impl SortKey {
    /// Classifies an identity text (canonical texts from `identity_of`).
    pub fn new(id: Identity) -> SortKey {
        if let Ok(i) = id.parse::<i64>()
            && i.to_string() == *id
        {
            return SortKey::Int(i);
        }
        if is_canonical_number(&id) {
            SortKey::Num(Box::new(id))
        } else {
            SortKey::Text(Box::new(id))
        }
    }

    /// The identity text.
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        match self {
            SortKey::Int(i) => std::borrow::Cow::Owned(i.to_string()),
            SortKey::Num(s) | SortKey::Text(s) => std::borrow::Cow::Borrowed(&**s),
        }
    }
}

impl Ord for SortKey {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (SortKey::Int(a), SortKey::Int(b)) => a.cmp(b),
            (SortKey::Text(a), SortKey::Text(b)) => a.cmp(b),
            (SortKey::Text(_), _) => Ordering::Greater,
            (_, SortKey::Text(_)) => Ordering::Less,
            (a, b) => {
                let (x, y) = (a.text(), b.text());
                compare_canonical(&x, &y).then_with(|| x.cmp(&y))
            }
        }
    }
}

impl PartialOrd for SortKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// One table's rows and indexes.
pub struct TableData {
    /// Rows by identity, each one buffer without its field names (see [`Shapes`]).
    rows: BTreeMap<SortKey, PackedRow>,
    /// The rows' shapes; its scan fields are the key fields then the index fields.
    shapes: Shapes,
    key_fields: Arc<[String]>,
    index_fields: Arc<[String]>,
    /// One per index field: canonical value → identities.
    indexes: Vec<HashMap<Box<str>, BTreeSet<SortKey>>>,
    /// Row count at which a baseline next rebuilds the trees with full nodes ([`compact_map`]).
    compact_at: usize,
}

/// Rows a baseline holds before its trees are first rebuilt full, and the growth (in eighths)
/// before the next rebuild: at most an eighth of the trees is ever half full, at the cost of
/// moving each entry about nine times over a baseline.
const FIRST_COMPACTION: usize = 1 << 16;
const COMPACTION_GROWTH_EIGHTHS: usize = 9;

/// Rebuilds a B-tree with full nodes. Keys inserted in ascending order (a baseline in key
/// order, the common case) leave every node of std's B-tree half full: it splits a full node in
/// the middle. `append` onto a non-empty map builds its nodes full (64 → 34 bytes an entry for
/// 16-byte keys and values), freeing the old nodes as it goes, so it needs no more memory than
/// the tree had.
fn compact_map<K: Ord, V>(map: &mut BTreeMap<K, V>) {
    if let Some((k, v)) = map.pop_first() {
        let mut full = BTreeMap::new();
        full.insert(k, v);
        full.append(map);
        *map = full;
    }
}

/// [`compact_map`] for a set (34 → 18 bytes an entry for 16-byte keys).
fn compact_set<K: Ord>(set: &mut BTreeSet<K>) {
    if let Some(k) = set.pop_first() {
        let mut full = BTreeSet::new();
        full.insert(k);
        full.append(set);
        *set = full;
    }
}

/// A row read once for storing: identity, index values, packed text.
struct Prepared {
    id: SortKey,
    index_values: Vec<Option<Box<str>>>,
    /// The identity comes from the key fields (not the row's own text).
    keyed: bool,
    packed: PackedRow,
}

fn index_text(v: &str) -> Box<str> {
    canonical_text_of(v).into_owned().into_boxed_str()
}

impl TableData {
    fn new(key_fields: Arc<[String]>, index_fields: Arc<[String]>) -> TableData {
        TableData {
            rows: BTreeMap::new(),
            indexes: index_fields.iter().map(|_| HashMap::new()).collect(),
            shapes: Shapes::new(
                key_fields
                    .iter()
                    .chain(index_fields.iter())
                    .cloned()
                    .collect(),
            ),
            key_fields,
            index_fields,
            compact_at: FIRST_COMPACTION,
        }
    }

    /// Rebuilds the primary tree and every index set with full nodes.
    fn compact(&mut self) {
        compact_map(&mut self.rows);
        for index in &mut self.indexes {
            index.values_mut().for_each(compact_set);
        }
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Identity, index values and packed text of a row, in one parse.
    fn prepare(&mut self, text: &str) -> Prepared {
        let k = self.key_fields.len();
        match packed_rows::scan(self.shapes.scan_fields(), text) {
            Ok(scanned) => {
                let keyed = identity_of(&scanned.fields[..k]);
                let index_values = scanned.fields[k..]
                    .iter()
                    .map(|v| v.map(|v| index_text(v.get())))
                    .collect();
                Prepared {
                    keyed: keyed.is_some(),
                    id: SortKey::new(keyed.unwrap_or_else(|| text.into())),
                    index_values,
                    packed: self.shapes.pack(&scanned),
                }
            }
            Err(_) => Prepared {
                id: SortKey::Text(Box::new(text.into())),
                index_values: vec![None; self.index_fields.len()],
                keyed: false,
                packed: Shapes::pack_whole(text),
            },
        }
    }

    /// A row's identity (what `prepare` would file it under).
    fn identity(&self, row: &Row) -> SortKey {
        match KeyCapture::scan(&self.key_fields, row.as_str()) {
            Ok(values) => SortKey::new(identity_of(&values).unwrap_or_else(|| row.as_str().into())),
            Err(_) => SortKey::Text(Box::new(row.as_str().into())),
        }
    }

    /// The index values of a stored row, read through its shape.
    fn stored_index_values(&self, row: &PackedRow) -> Vec<Option<Box<str>>> {
        let k = self.key_fields.len();
        self.shapes.fields(row)[k..]
            .iter()
            .map(|v| v.map(index_text))
            .collect()
    }

    /// The exact text of a stored row.
    fn text(&self, row: &PackedRow) -> String {
        self.shapes.text(row)
    }

    /// Adds a baseline row. A baseline holds each identity once, so a second row with the same
    /// key values means the key fields do not identify rows (a wrong `key_fields`): an error,
    /// never a silent merge into fewer rows.
    fn insert_baseline(&mut self, row: Row) -> Result<(), String> {
        let p = self.prepare(row.as_str());
        // Names only: this text reaches /status and logs, which must not carry row values.
        if p.keyed && self.rows.contains_key(&p.id) {
            return Err(format!(
                "two rows of the baseline share a value of the key ({}): the key fields do not \
                 identify rows (a wrong key_fields?)",
                self.key_fields.join(", "),
            ));
        }
        self.upsert_prepared(p.id, p.index_values, p.packed);
        if self.rows.len() >= self.compact_at {
            self.compact();
            self.compact_at = self.rows.len() / 8 * COMPACTION_GROWTH_EIGHTHS;
        }
        Ok(())
    }

    fn unindex(&mut self, id: &SortKey, values: Vec<Option<Box<str>>>) {
        for (i, v) in values.into_iter().enumerate() {
            if let Some(v) = v
                && let Some(set) = self.indexes[i].get_mut(&v)
            {
                set.remove(id);
                if set.is_empty() {
                    self.indexes[i].remove(&v);
                }
            }
        }
    }

    fn upsert_prepared(&mut self, id: SortKey, values: Vec<Option<Box<str>>>, row: PackedRow) {
        if !self.index_fields.is_empty() {
            if let Some(old) = self.rows.get(&id) {
                let old_values = self.stored_index_values(old);
                self.unindex(&id, old_values);
            }
            for (i, v) in values.into_iter().enumerate() {
                if let Some(v) = v {
                    self.indexes[i].entry(v).or_default().insert(id.clone());
                }
            }
        }
        self.rows.insert(id, row);
    }

    fn remove(&mut self, id: &SortKey) {
        if let Some(old) = self.rows.remove(id)
            && !self.index_fields.is_empty()
        {
            let values = self.stored_index_values(&old);
            self.unindex(id, values);
        }
    }

    fn clear(&mut self) {
        self.rows.clear();
        for i in &mut self.indexes {
            i.clear();
        }
    }

    /// Applies a change as the fold does (R5): upsert `new`; an UPDATE whose old identity
    /// differs also removes the old one; DELETE of an unknown identity is a no-op.
    fn apply(&mut self, c: &ChangeEvent) {
        let change = larch_archive::model::Change {
            action: c.action,
            key: String::new(),
            old: c.old.clone(),
            new: c.new.clone(),
        };
        match c.action {
            Action::Truncate => self.clear(),
            Action::Delete => {
                let Some(old) = c.old.as_ref().or(c.new.as_ref()) else {
                    return;
                };
                let id = self.identity(old);
                self.remove(&id);
            }
            Action::Insert | Action::Update => {
                let Some(new) = &c.new else { return };
                let id = SortKey::new(change_identity(&change, &self.key_fields));
                if c.action == Action::Update
                    && let Some(old) = &c.old
                    && let Some(old_id) = row_identity(old, &self.key_fields)
                    && *old_id != *id.text()
                {
                    self.remove(&SortKey::new(old_id));
                }
                let p = self.prepare(new.as_str());
                self.upsert_prepared(id, p.index_values, p.packed);
            }
        }
    }
}

#[derive(Default)]
struct Meta {
    columns: Vec<ColumnDefinition>,
    position: Option<String>,
    last_rebaseline: Option<DateTime<Utc>>,
    baselines: u64,
}

/// A page request: at most `limit` rows after the cursor, matching every
/// `(index, value)` filter.
struct PageQuery {
    limit: usize,
    after: Option<SortKey>,
    filters: Vec<(usize, Box<str>)>,
}

impl TableData {
    /// Up to `limit + 1` rows after `after` in table order (one more than the page, to know
    /// whether a next page exists), through the first filter's index when there is one.
    fn page_rows(
        &self,
        after: Option<&SortKey>,
        filters: &[(usize, Box<str>)],
        limit: usize,
    ) -> Vec<(&SortKey, &PackedRow)> {
        let lower = match after {
            Some(a) => Bound::Excluded(a),
            None => Bound::Unbounded,
        };
        let mut out: Vec<(&SortKey, &PackedRow)> = Vec::with_capacity(limit + 1);
        match filters.split_first() {
            None => {
                out.extend(self.rows.range((lower, Bound::Unbounded)).take(limit + 1));
            }
            Some(((first, value), rest)) => {
                if let Some(set) = self.indexes[*first].get(value) {
                    let rest_sets: Option<Vec<&BTreeSet<SortKey>>> =
                        rest.iter().map(|(i, v)| self.indexes[*i].get(v)).collect();
                    if let Some(rest_sets) = rest_sets {
                        for id in set.range((lower, Bound::Unbounded)) {
                            if rest_sets.iter().all(|s| s.contains(id))
                                && let Some((k, r)) = self.rows.get_key_value(id)
                            {
                                out.push((k, r));
                                if out.len() > limit {
                                    break;
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

/// A query the HTTP layer could not run (HTTP 400).
#[derive(Debug, PartialEq, Eq)]
pub struct QueryError(pub String);

pub const DEFAULT_PAGE: usize = 100;
pub const MAX_PAGE: usize = 10_000;

pub struct MemoryTarget {
    table: TableId,
    index_fields: Arc<[String]>,
    /// Key fields and columns for the next baseline (from `init`); they become the live ones
    /// with it, so a re-baseline with another schema swaps table and schema together (C2).
    next: Mutex<(Arc<[String]>, Vec<ColumnDefinition>)>,
    live: RwLock<TableData>,
    aside: Mutex<Option<(TableData, Vec<ColumnDefinition>)>>,
    meta: Mutex<Meta>,
    /// Every applied change, for the gRPC API's Subscribe and WatchStatus (sent only while
    /// someone listens; a listener that falls [`CHANGE_FEED`] behind is told and dropped).
    changes: tokio::sync::broadcast::Sender<Arc<ChangeEvent>>,
}

/// Changes a slow subscriber may be behind before its stream ends.
pub const CHANGE_FEED: usize = 1024;

impl MemoryTarget {
    pub fn new(table: TableId, index_fields: Vec<String>) -> MemoryTarget {
        let index_fields: Arc<[String]> = index_fields.into();
        let key_fields: Arc<[String]> = vec!["id".to_string()].into();
        MemoryTarget {
            table,
            live: RwLock::new(TableData::new(key_fields.clone(), index_fields.clone())),
            index_fields,
            next: Mutex::new((key_fields, Vec::new())),
            aside: Mutex::new(None),
            meta: Mutex::new(Meta::default()),
            changes: tokio::sync::broadcast::channel(CHANGE_FEED).0,
        }
    }

    /// The changes applied from now on.
    pub fn changes(&self) -> tokio::sync::broadcast::Receiver<Arc<ChangeEvent>> {
        self.changes.subscribe()
    }

    /// The key fields of the live table.
    pub fn key_fields(&self) -> Arc<[String]> {
        self.live.read_locked().key_fields.clone()
    }

    /// The columns of the live table (its archive's, as of its last baseline).
    pub fn columns(&self) -> Vec<ColumnDefinition> {
        self.meta.locked().columns.clone()
    }

    /// Distinct values held by each index field's index, in `index_fields` order.
    pub fn index_entries(&self) -> Vec<usize> {
        self.live
            .read_locked()
            .indexes
            .iter()
            .map(HashMap::len)
            .collect()
    }

    /// A page as row texts and the next cursor: [`MemoryTarget::page`]'s parameters.
    pub fn page_texts(
        &self,
        params: &[(String, String)],
    ) -> Result<(Vec<String>, Option<String>), QueryError> {
        let PageQuery {
            limit,
            after,
            filters,
        } = self.page_query(params)?;
        let data = self.live.read_locked();
        let mut out = data.page_rows(after.as_ref(), &filters, limit);
        let next = self.cut_page(&mut out, limit);
        Ok((out.iter().map(|(_, r)| data.text(r)).collect(), next))
    }

    pub fn table(&self) -> &TableId {
        &self.table
    }

    pub fn len(&self) -> usize {
        self.live.read_locked().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn position(&self) -> Option<String> {
        self.meta.locked().position.clone()
    }

    /// All rows as JSON texts, in table order (tests, benchmarks).
    pub fn rows(&self) -> Vec<String> {
        let data = self.live.read_locked();
        data.rows.values().map(|r| data.text(r)).collect()
    }

    /// `GET /tables/{t}`.
    pub fn describe(&self) -> serde_json::Value {
        let key_fields = self.live.read_locked().key_fields.clone();
        let meta = self.meta.locked();
        serde_json::json!({
            "table": self.table.to_string(),
            "columns": meta.columns.iter().map(column_json).collect::<Vec<_>>(),
            "primary_key": &*key_fields,
            "index_fields": &*self.index_fields,
            "row_count": self.len(),
            "position": meta.position,
            "last_rebaseline": meta.last_rebaseline.map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true)),
            "baselines": meta.baselines,
        })
    }

    /// `GET /tables/{t}/rows?limit=N&after=CURSOR&<index field>=<value>...` as a JSON body.
    pub fn page(&self, params: &[(String, String)]) -> Result<String, QueryError> {
        let PageQuery {
            limit,
            after,
            filters,
        } = self.page_query(params)?;
        let data = self.live.read_locked();
        let mut out = data.page_rows(after.as_ref(), &filters, limit);
        let next = self.cut_page(&mut out, limit);
        // Packed rows lack their field names: room for those too.
        let mut body = String::with_capacity(
            64 + out
                .iter()
                .map(|(_, r)| 2 * r.stored_len() + 1)
                .sum::<usize>(),
        );
        let _ = write!(
            body,
            "{{\"table\":{},\"rows\":[",
            serde_json::to_string(&self.table.to_string()).expect("string")
        );
        for (i, (_, r)) in out.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            data.shapes.write(r, &mut body);
        }
        let _ = write!(
            body,
            "],\"next\":{}}}",
            serde_json::to_string(&next).expect("string")
        );
        Ok(body)
    }

    /// Cuts rows read one past `limit` ([`TableData::page_rows`]) to the page; the cursor of the
    /// next page when there is one.
    fn cut_page(&self, rows: &mut Vec<(&SortKey, &PackedRow)>, limit: usize) -> Option<String> {
        if rows.len() <= limit {
            return None;
        }
        rows.truncate(limit);
        rows.last().map(|(k, _)| encode_cursor(&self.table, k))
    }

    /// Reads `limit`, `after` and the index field filters of a page request.
    fn page_query(&self, params: &[(String, String)]) -> Result<PageQuery, QueryError> {
        let mut limit = DEFAULT_PAGE;
        let mut after: Option<SortKey> = None;
        let mut filters: Vec<(usize, Box<str>)> = Vec::new();
        refuse_repeats(params)?;
        for (k, v) in params {
            match k.as_str() {
                "limit" => {
                    limit = v
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_PAGE).contains(n))
                        .ok_or_else(|| {
                            QueryError(format!(
                                "limit: expected an integer from 1 to {MAX_PAGE}, got {v:?}"
                            ))
                        })?;
                }
                "after" => after = Some(decode_cursor(&self.table, v)?),
                field => {
                    let Some(i) = self.index_fields.iter().position(|f| f == field) else {
                        return Err(QueryError(format!(
                            "field {field:?} is not indexed (indexed fields: {})",
                            if self.index_fields.is_empty() {
                                "none".to_string()
                            } else {
                                self.index_fields.join(", ")
                            }
                        )));
                    };
                    filters.push((i, query_value(v)));
                }
            }
        }
        Ok(PageQuery {
            limit,
            after,
            filters,
        })
    }

    /// `GET /tables/{t}/row?<pk>=<value>...`: the row's exact text, `None` when absent.
    pub fn get(&self, params: &[(String, String)]) -> Result<Option<String>, QueryError> {
        let data = self.live.read_locked();
        let key_fields = data.key_fields.clone();
        refuse_repeats(params)?;
        for (k, _) in params {
            if !key_fields.contains(k) {
                return Err(QueryError(format!(
                    "{k:?} is not a primary-key field (primary key: {})",
                    key_fields.join(", ")
                )));
            }
        }
        let mut values: Vec<Box<RawValue>> = Vec::with_capacity(key_fields.len());
        for f in key_fields.iter() {
            let Some((_, v)) = params.iter().find(|(k, _)| k == f) else {
                return Err(QueryError(format!(
                    "missing primary-key field {f:?} (primary key: {})",
                    key_fields.join(", ")
                )));
            };
            values.push(string_value(v));
        }
        let refs: Vec<Option<&RawValue>> = values.iter().map(|v| Some(&**v)).collect();
        let id = SortKey::new(identity_of(&refs).expect("every key value present"));
        Ok(data.rows.get(&id).map(|r| data.text(r)))
    }
}

fn query_value(v: &str) -> Box<str> {
    canonical_text(&string_value(v))
        .into_owned()
        .into_boxed_str()
}

/// A parameter given twice is ambiguous (`row?id=6&id=7`): refused, never "the first one wins".
fn refuse_repeats(params: &[(String, String)]) -> Result<(), QueryError> {
    for (i, (k, _)) in params.iter().enumerate() {
        if params[..i].iter().any(|(p, _)| p == k) {
            return Err(QueryError(format!(
                "{k:?} is given more than once (one value per parameter)"
            )));
        }
    }
    Ok(())
}

/// Bytes of the check that ends a cursor.
const CURSOR_CHECK: usize = 8;

/// The check of a cursor: the table and the identity, hashed, so a cursor that was not made
/// by a `next` field of this table (forged, cut, or another table's) is refused instead of
/// silently paging from wherever it decodes to. Not a secret: replicas and restarts agree.
fn cursor_check(table: &TableId, identity: &str) -> [u8; CURSOR_CHECK] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(table.to_string().as_bytes());
    h.update([0]);
    h.update(identity.as_bytes());
    h.finalize()[..CURSOR_CHECK].try_into().expect("8 bytes")
}

fn encode_cursor(table: &TableId, k: &SortKey) -> String {
    let text = k.text();
    let mut bytes = text.as_bytes().to_vec();
    bytes.extend_from_slice(&cursor_check(table, &text));
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn decode_cursor(table: &TableId, c: &str) -> Result<SortKey, QueryError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(c)
        .ok()
        .filter(|b| b.len() > CURSOR_CHECK)
        .and_then(|mut b| {
            let check = b.split_off(b.len() - CURSOR_CHECK);
            let text = String::from_utf8(b).ok()?;
            (check == cursor_check(table, &text)).then_some(text)
        })
        .map(|s| SortKey::new(s.into_boxed_str()))
        .ok_or_else(|| {
            QueryError(format!(
                "after: {c:?} is not a cursor from a `next` field of {table}"
            ))
        })
}

#[async_trait]
impl Target for MemoryTarget {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn is_durable(&self) -> bool {
        false
    }

    async fn init(
        &self,
        columns: &[ColumnDefinition],
        key_fields: &[String],
    ) -> anyhow::Result<()> {
        *self.next.locked() = (key_fields.to_vec().into(), columns.to_vec());
        Ok(())
    }

    async fn begin_baseline(&self) -> anyhow::Result<()> {
        let (key_fields, columns) = self.next.locked().clone();
        *self.aside.locked() = Some((
            TableData::new(key_fields, self.index_fields.clone()),
            columns,
        ));
        Ok(())
    }

    async fn baseline_rows(&self, rows: Vec<Row>) -> anyhow::Result<()> {
        let mut aside = self.aside.locked();
        let (data, _) = aside
            .as_mut()
            .ok_or_else(|| anyhow::anyhow!("baseline rows without a baseline in progress"))?;
        for r in rows {
            data.insert_baseline(r)
                .map_err(|e| anyhow::anyhow!("memory target {}: {e}", self.table))?;
        }
        Ok(())
    }

    async fn commit_baseline(&self, position: &str) -> anyhow::Result<()> {
        let (mut new, columns) = self
            .aside
            .locked()
            .take()
            .ok_or_else(|| anyhow::anyhow!("commit without a baseline in progress"))?;
        // The rows since the last rebuild: the table starts following with full nodes.
        new.compact();
        let old = {
            let mut live = self.live.write_locked();
            let mut meta = self.meta.locked();
            meta.columns = columns;
            meta.position = Some(position.to_string());
            meta.baselines += 1;
            if meta.baselines > 1 {
                meta.last_rebaseline = Some(Utc::now());
            }
            std::mem::replace(&mut *live, new)
        };
        // Freeing a large table takes a while: not on the runtime's threads.
        tokio::task::spawn_blocking(move || drop(old));
        Ok(())
    }

    async fn abort_baseline(&self) {
        self.aside.locked().take();
    }

    async fn apply(&self, change: &ChangeEvent) -> anyhow::Result<()> {
        self.live.write_locked().apply(change);
        if self.changes.receiver_count() > 0 {
            let _ = self.changes.send(Arc::new(change.clone()));
        }
        Ok(())
    }

    async fn checkpoint(&self, position: &str) -> anyhow::Result<()> {
        self.meta.locked().position = Some(position.to_string());
        Ok(())
    }

    fn index_fields(&self) -> &[String] {
        &self.index_fields
    }

    fn row_count(&self) -> Option<u64> {
        Some(self.len() as u64)
    }
}

/// A column as the HTTP API shows it: snake_case like every other key the API answers (the
/// manifest keeps laredo's PascalCase; docs/engine.md, "HTTP API").
fn column_json(c: &ColumnDefinition) -> serde_json::Value {
    serde_json::json!({
        "name": c.name,
        "type": c.type_name,
        "sql_type": (!c.sql_type.is_empty()).then_some(&c.sql_type),
        "nullable": c.nullable,
        "primary_key": c.primary_key,
        "primary_key_ordinal": c.primary_key_ordinal,
        "ordinal_position": c.ordinal_position,
        "default_value": c.default_value,
        "max_length": c.max_length,
        "type_oid": c.type_oid,
    })
}

#[cfg(test)]
mod tests;
