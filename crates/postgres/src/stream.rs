//! Streaming: START_REPLICATION on the slot, pgoutput decoding, transaction framing,
//! primary-key changes, unchanged-TOAST filling, acks and reconnects.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use chrono::{DateTime, Utc};
use pgwire_replication::{PgWireError, ReplicationClient, ReplicationEvent};
use tokio::sync::mpsc;

use super::config::{SlotMode, ident, qualified};
use super::pgoutput::{self, Cell, Message, OldTuple, RelationColumn};
use super::schema::{self, TableSchema};
use super::schema_change::{self, SchemaChange};
use super::snapshot::{CreatedSlot, replication_error};
use super::types::{Kind, to_json};
use super::{Inner, remember_end};
use larch_archive::model::{Action, TableId};
use larch_archive::position::Lsn;
use larch_archive::source::{ChangeEvent, SourceError, SourceEvent, SourceState};
use larch_archive::value::{Row, RowMap, raw};
use larch_core::locks::MutexExt;

/// Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01).
const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;
const LAG_REFRESH: Duration = Duration::from_secs(5);

struct Rel {
    table: TableId,
    columns: Vec<RelationColumn>,
    kinds: Vec<Kind>,
    tracked: bool,
}

struct Txn {
    commit: u64,
    time: Option<DateTime<Utc>>,
    skip: bool,
}

impl Txn {
    /// The transaction a BEGIN opens; one that committed before `next_wanted` was delivered
    /// already and is skipped.
    #[inline]
    fn begin(final_lsn: u64, commit_time_micros: i64, next_wanted: u64) -> Txn {
        Txn {
            commit: final_lsn,
            time: DateTime::from_timestamp_micros(commit_time_micros + PG_EPOCH_OFFSET_MICROS),
            skip: final_lsn < next_wanted,
        }
    }
}

enum Failure {
    /// Reconnect and continue.
    Transient(anyhow::Error),
    Fatal(SourceError),
}

pub(super) async fn run(
    inner: &Inner,
    from: &str,
    events: mpsc::Sender<SourceEvent>,
) -> Result<(), SourceError> {
    let from_lsn = Lsn::parse(from)
        .ok_or_else(|| anyhow!("cannot stream from {from:?}: not a PostgreSQL LSN (X/XXXXXXXX)"))?
        .0;
    let slot = inner.config.slot_name.clone();
    let mut pending = inner.pending.lock().await.take();
    let mut next_wanted = first_wanted(inner, pending.as_ref(), from_lsn).await?;
    let mut rels: HashMap<u32, Rel> = HashMap::new();
    let mut attempt = Reconnects::new(&inner.config.reconnect);
    let mut closed = inner.closed.subscribe();
    if *closed.borrow() {
        return Err(SourceError::Stopped);
    }

    loop {
        // 1. A session: the one that created the slot, or a new one (persistent slots only).
        let mut session = match start_session(inner, pending.take(), next_wanted).await {
            Ok(s) => s,
            Err(Failure::Fatal(e)) => return Err(e),
            Err(Failure::Transient(e)) => {
                backoff(inner, &mut attempt, &e, &mut closed).await?;
                continue;
            }
        };
        inner.set_state(SourceState::Streaming);
        tracing::info!(slot = %slot, from = %Lsn(next_wanted), "streaming from replication slot");

        // 2. Events until failure or close.
        let outcome = pump(
            inner,
            &mut session,
            &events,
            &mut rels,
            &mut next_wanted,
            &mut attempt,
            &mut closed,
        )
        .await;
        match outcome {
            Ok(()) => {
                stop_session(inner, session).await;
                return Ok(());
            }
            Err(Failure::Fatal(SourceError::Stopped)) => {
                stop_session(inner, session).await;
                return if inner.is_closed() {
                    Ok(())
                } else {
                    Err(SourceError::Stopped)
                };
            }
            Err(Failure::Fatal(e)) => {
                session.abort();
                return Err(e);
            }
            Err(Failure::Transient(e)) => {
                session.abort();
                if inner.config.slot_mode == SlotMode::Temporary {
                    return Err(SourceError::ReBaselineRequired(format!(
                        "the session of temporary replication slot {slot} ended ({e:#}); the slot is gone"
                    )));
                }
                backoff(inner, &mut attempt, &e, &mut closed).await?;
            }
        }
    }
}

/// The first commit LSN to deliver. `from` is either a delivered commit LSN (exclusive) or a
/// position the slot itself reports (its consistent point or confirmed position: nothing at it
/// was delivered yet, inclusive).
async fn first_wanted(
    inner: &Inner,
    pending: Option<&CreatedSlot>,
    from_lsn: u64,
) -> Result<u64, SourceError> {
    let inclusive = match pending {
        Some(p) => p.consistent_point == from_lsn,
        None => {
            let client = inner.client().await?;
            match schema::slot_info(&client, &inner.config.slot_name).await? {
                Some(info) => info.confirmed_flush == Some(from_lsn),
                None => false,
            }
        }
    };
    Ok(if inclusive { from_lsn } else { from_lsn + 1 })
}

/// A started session: the one that created the slot (`pending`), else a new one.
async fn start_session(
    inner: &Inner,
    pending: Option<CreatedSlot>,
    next_wanted: u64,
) -> Result<ReplicationClient, Failure> {
    let mut session = match pending {
        Some(created) => {
            let mut s = created.session;
            s.start()
                .await
                .map_err(|e| Failure::Fatal(replication_error(&inner.config, &e).into()))?;
            s
        }
        None => open_session(inner, next_wanted).await?,
    };
    if let Err(e) = session.wait_started().await {
        return Err(classify(inner, &e).await);
    }
    Ok(session)
}

/// Ends a session gracefully, the last acknowledged position reported first: the library sends
/// feedback at most once a status interval and not on stop, so without the wait a restart
/// could resume before what was acknowledged (bounded: a stuck session just stops).
async fn stop_session(inner: &Inner, mut session: ReplicationClient) {
    let acked = inner.acked_end.load(Ordering::SeqCst);
    session.update_applied_lsn(pgwire_replication::Lsn(acked));
    let reported = session.metrics();
    let deadline = Instant::now() + inner.config.status_interval * 3;
    while reported.last_applied_lsn().0 < acked && session.is_running() && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if tokio::time::timeout(Duration::from_secs(5), session.shutdown())
        .await
        .is_err()
    {
        session.abort();
    }
}

/// The reconnects made since the last committed transaction, and the delay before the next.
struct Reconnects {
    made: u32,
    backoff: larch_core::retry::Backoff,
}

impl Reconnects {
    fn new(policy: &crate::config::Reconnect) -> Self {
        Reconnects {
            made: 0,
            backoff: larch_core::retry::Backoff::with_factor(
                policy.initial,
                policy.max,
                policy.multiplier as f32,
            ),
        }
    }

    fn reset(&mut self) {
        self.made = 0;
        self.backoff.reset();
    }
}

async fn backoff(
    inner: &Inner,
    attempt: &mut Reconnects,
    error: &anyhow::Error,
    closed: &mut tokio::sync::watch::Receiver<bool>,
) -> Result<(), SourceError> {
    let policy = &inner.config.reconnect;
    if policy.max_attempts != 0 && attempt.made >= policy.max_attempts {
        let reason = crate::reasons::classify(error);
        return Err(larch_core::failure::tag(
            reason,
            anyhow!(
                "replication from slot {} failed after {} reconnect attempts: {error:#}",
                inner.config.slot_name,
                attempt.made
            ),
        )
        .into());
    }
    let delay = attempt.backoff.next_delay();
    attempt.made += 1;
    inner.set_state(SourceState::Connecting);
    tracing::warn!(slot = %inner.config.slot_name, attempt = attempt.made, delay_ms = delay.as_millis() as u64, error = %format!("{error:#}"), "replication interrupted; reconnecting");
    tokio::select! {
        _ = tokio::time::sleep(delay) => Ok(()),
        _ = closed.wait_for(|c| *c) => Err(SourceError::Stopped),
    }
}

/// Opens a new replication session on an existing persistent slot.
async fn open_session(inner: &Inner, next_wanted: u64) -> Result<ReplicationClient, Failure> {
    let slot = &inner.config.slot_name;
    if inner.config.slot_mode == SlotMode::Temporary {
        return Err(Failure::Fatal(SourceError::ReBaselineRequired(format!(
            "temporary replication slot {slot} does not exist any more: take a new baseline"
        ))));
    }
    let client = inner.client().await.map_err(Failure::Transient)?;
    check_slot(&client, slot).await?;
    let acked = inner.acked_end.load(Ordering::SeqCst);
    let rc = inner
        .config
        .replication(next_wanted, Some(acked))
        .map_err(|e| Failure::Fatal(e.into()))?;
    ReplicationClient::connect(rc).await.map_err(|e| {
        if e.is_transient() {
            Failure::Transient(replication_error(&inner.config, &e))
        } else {
            Failure::Fatal(replication_error(&inner.config, &e).into())
        }
    })
}

/// A missing or invalidated slot can never deliver the consumer's next change.
async fn check_slot(client: &tokio_postgres::Client, slot: &str) -> Result<(), Failure> {
    match schema::slot_info(client, slot)
        .await
        .map_err(Failure::Transient)?
    {
        None => Err(Failure::Fatal(SourceError::ReBaselineRequired(format!(
            "replication slot {slot} does not exist (dropped?): take a new baseline"
        )))),
        Some(info) if info.wal_status.as_deref() == Some("lost") => {
            Err(Failure::Fatal(SourceError::ReBaselineRequired(format!(
                "replication slot {slot} was invalidated (wal_status = lost, WAL removed): take a new baseline"
            ))))
        }
        Some(_) => Ok(()),
    }
}

async fn classify(inner: &Inner, e: &PgWireError) -> Failure {
    let slot = &inner.config.slot_name;
    let text = e.to_string();
    if text.contains("can no longer get changes") || text.contains("has been invalidated") {
        return Failure::Fatal(SourceError::ReBaselineRequired(format!(
            "replication slot {slot} was invalidated: {text}"
        )));
    }
    if text.contains("replication slot") && text.contains("does not exist") {
        return Failure::Fatal(SourceError::ReBaselineRequired(format!(
            "replication slot {slot} does not exist: {text}"
        )));
    }
    if e.is_transient()
        || matches!(e, PgWireError::Internal(_))
        || text.contains("is active for PID")
        || text.contains("terminating connection")
    {
        // Before retrying, make sure the slot is still usable.
        if inner.config.slot_mode == SlotMode::Persistent
            && let Ok(client) = inner.client().await
            && let Err(f) = check_slot(&client, slot).await
        {
            return f;
        }
        return Failure::Transient(replication_error(&inner.config, e));
    }
    Failure::Fatal(replication_error(&inner.config, e).into())
}

#[allow(clippy::too_many_arguments)]
async fn pump(
    inner: &Inner,
    session: &mut ReplicationClient,
    events: &mpsc::Sender<SourceEvent>,
    rels: &mut HashMap<u32, Rel>,
    next_wanted: &mut u64,
    attempt: &mut Reconnects,
    closed: &mut tokio::sync::watch::Receiver<bool>,
) -> Result<(), Failure> {
    let mut txn: Option<Txn> = None;
    let mut paused = inner.paused.subscribe();
    let mut last_lag = Instant::now() - LAG_REFRESH;
    loop {
        session.update_applied_lsn(pgwire_replication::Lsn(
            inner.acked_end.load(Ordering::SeqCst),
        ));
        if *paused.borrow() {
            inner.set_state(SourceState::Paused);
            tokio::select! {
                _ = paused.wait_for(|p| !*p) => { inner.set_state(SourceState::Streaming); }
                _ = closed.wait_for(|c| *c) => return Ok(()),
            }
            continue;
        }
        if last_lag.elapsed() >= LAG_REFRESH {
            last_lag = Instant::now();
            let _ = inner.refresh_lag().await;
        }
        let event = tokio::select! {
            ev = session.recv() => ev,
            _ = inner.ack_notify.notified() => continue,
            _ = closed.wait_for(|c| *c) => return Ok(()),
            _ = paused.changed() => continue,
        };
        let event = match event {
            Ok(Some(ev)) => ev,
            Ok(None) => {
                return Err(Failure::Transient(anyhow!(
                    "the server ended the replication stream"
                )));
            }
            Err(e) => return Err(classify(inner, &e).await),
        };
        match event {
            ReplicationEvent::Begin {
                final_lsn,
                commit_time_micros,
                ..
            } => {
                txn = Some(Txn::begin(final_lsn.0, commit_time_micros, *next_wanted));
            }
            ReplicationEvent::XLogData { data, .. } => {
                let msg = pgoutput::decode(&data)
                    .context("decoding a pgoutput message")
                    .map_err(|e| Failure::Fatal(e.into()))?;
                handle(inner, msg, txn.as_ref(), rels, events, closed).await?;
            }
            ReplicationEvent::Commit { lsn, end_lsn, .. } => {
                let t = txn.take();
                if t.as_ref().is_some_and(|t| t.skip) || lsn.0 < *next_wanted {
                    continue;
                }
                commit(inner, events, closed, lsn.0, end_lsn.0).await?;
                *next_wanted = lsn.0 + 1;
                attempt.reset();
            }
            ReplicationEvent::KeepAlive { .. }
            | ReplicationEvent::Message { .. }
            | ReplicationEvent::StoppedAt { .. } => {}
        }
    }
}

/// A delivered transaction's COMMIT: its end remembered for acks, its position checkpointed.
async fn commit(
    inner: &Inner,
    events: &mpsc::Sender<SourceEvent>,
    closed: &mut tokio::sync::watch::Receiver<bool>,
    lsn: u64,
    end_lsn: u64,
) -> Result<(), Failure> {
    remember_end(inner, lsn, end_lsn);
    deliver(
        events,
        SourceEvent::Checkpoint {
            position: Lsn(lsn).to_string(),
        },
        closed,
    )
    .await
}

async fn handle(
    inner: &Inner,
    msg: Message,
    txn: Option<&Txn>,
    rels: &mut HashMap<u32, Rel>,
    events: &mpsc::Sender<SourceEvent>,
    closed: &mut tokio::sync::watch::Receiver<bool>,
) -> Result<(), Failure> {
    if let Message::Relation(r) = msg {
        return on_relation(inner, r, rels).await;
    }
    let Some(txn) = txn else {
        return Err(Failure::Fatal(
            anyhow!("pgoutput change outside a transaction").into(),
        ));
    };
    if txn.skip {
        return Ok(());
    }
    let position = Lsn(txn.commit).to_string();
    let emit = |table: &TableId, action: Action, old: Option<Row>, new: Option<Row>| ChangeEvent {
        table: table.clone(),
        action,
        position: position.clone(),
        old,
        new,
        commit_time: txn.time,
    };
    let mut out: Vec<ChangeEvent> = Vec::new();
    match msg {
        Message::Relation(_) | Message::Other(_) => {}
        Message::Truncate { rels: ids, .. } => {
            for id in ids {
                if let Some(rel) = rels.get(&id).filter(|r| r.tracked) {
                    out.push(emit(&rel.table, Action::Truncate, None, None));
                }
            }
        }
        Message::Insert { rel, new } => {
            let Some(r) = tracked(rels, rel)? else {
                return Ok(());
            };
            let row = build_row(r, &new, None);
            out.push(emit(&r.table, Action::Insert, None, Some(row.into_row())));
        }
        Message::Delete { rel, old } => {
            let Some(r) = tracked(rels, rel)? else {
                return Ok(());
            };
            let row = old_row(r, &old);
            out.push(emit(&r.table, Action::Delete, Some(row), None));
        }
        Message::Update { rel, old, new } => {
            let Some(r) = tracked(rels, rel)? else {
                return Ok(());
            };
            update_events(inner, r, old.as_ref(), &new, &emit, &mut out).await?;
        }
    }
    for ev in out {
        deliver(events, SourceEvent::Change(ev), closed).await?;
    }
    Ok(())
}

/// A Relation message: the columns and value kinds of the relation's next changes; a followed
/// table's is checked against the archived schema first.
async fn on_relation(
    inner: &Inner,
    r: pgoutput::Relation,
    rels: &mut HashMap<u32, Rel>,
) -> Result<(), Failure> {
    let table = TableId::new(r.namespace.clone(), r.name.clone());
    let tracked = inner.tables().contains(&table);
    if tracked && let Some(why) = schema_drift(inner, &table, &r).await? {
        return Err(Failure::Fatal(SourceError::SchemaChanged(format!(
            "table {table}: {why}"
        ))));
    }
    let oids: Vec<u32> = r.columns.iter().map(|c| c.type_oid).collect();
    let kinds = if tracked {
        let client = inner.client().await.map_err(Failure::Transient)?;
        let mut cache = inner.kinds.lock().await;
        schema::resolve_kinds(&client, &oids, &mut cache)
            .await
            .map_err(Failure::Transient)?;
        oids.iter()
            .map(|o| cache.get(o).cloned().unwrap_or(Kind::Text))
            .collect()
    } else {
        Vec::new()
    };
    rels.insert(
        r.oid,
        Rel {
            table,
            columns: r.columns,
            kinds,
            tracked,
        },
    );
    Ok(())
}

/// The events of one UPDATE: unchanged TOASTed values filled in, and a primary-key change
/// split into a delete and an insert (W4).
async fn update_events(
    inner: &Inner,
    r: &Rel,
    old: Option<&OldTuple>,
    new: &[Cell],
    emit: &impl Fn(&TableId, Action, Option<Row>, Option<Row>) -> ChangeEvent,
    out: &mut Vec<ChangeEvent>,
) -> Result<(), Failure> {
    let schema = inner.schemas.locked().get(&r.table).cloned();
    let mut built = build_row(r, new, old);
    if !built.missing.is_empty() {
        fill_unchanged(inner, r, schema.as_ref(), new, old, &mut built).await?;
    }
    let new_row = built.into_row();
    let key_changed = match (old, &schema) {
        (Some(o), Some(s)) => key_differs(r, s, o.cells(), new),
        _ => false,
    };
    let old_row = old.map(|o| old_row(r, o));
    if key_changed {
        // W4: the old identity goes away, the new one appears.
        out.push(emit(&r.table, Action::Delete, old_row, None));
        out.push(emit(&r.table, Action::Insert, None, Some(new_row)));
    } else {
        let old_row = match old {
            Some(OldTuple::Full(_)) => old_row,
            _ => None,
        };
        out.push(emit(&r.table, Action::Update, old_row, Some(new_row)));
    }
    Ok(())
}

/// Checks a followed table's Relation message (pgoutput sends one before the first change
/// after a DDL, and at each session's first change) against the schema being archived, then
/// the catalog now, which also knows the primary key and each column's identity (a column
/// dropped and added again). Only a shape change counts (see [`schema_change`]).
async fn schema_drift(
    inner: &Inner,
    table: &TableId,
    rel: &pgoutput::Relation,
) -> Result<Option<String>, Failure> {
    let Some(recorded) = inner.schemas.locked().get(table).cloned() else {
        return Ok(None);
    };
    if let Some(why) = schema_change::relation_differs(rel, &recorded) {
        return Ok(Some(why));
    }
    let client = inner.client().await.map_err(Failure::Transient)?;
    let now = schema::discover(&client, table, &inner.config.key_fields)
        .await
        .map_err(Failure::Transient)?;
    Ok(
        match schema_change::classify(
            &recorded.columns,
            &recorded.key_fields,
            &now.columns,
            &now.key_fields,
        ) {
            SchemaChange::Shape(why) => Some(why),
            SchemaChange::None | SchemaChange::Metadata => None,
        },
    )
}

/// Sends one event, waiting for room (backpressure) but not past `close()`.
async fn deliver(
    events: &mpsc::Sender<SourceEvent>,
    event: SourceEvent,
    closed: &mut tokio::sync::watch::Receiver<bool>,
) -> Result<(), Failure> {
    tokio::select! {
        sent = events.send(event) => sent.map_err(|_| Failure::Fatal(SourceError::Stopped)),
        _ = closed.wait_for(|c| *c) => Err(Failure::Fatal(SourceError::Stopped)),
    }
}

fn tracked(rels: &HashMap<u32, Rel>, id: u32) -> Result<Option<&Rel>, Failure> {
    match rels.get(&id) {
        Some(r) if r.tracked => Ok(Some(r)),
        Some(_) => Ok(None),
        None => Err(Failure::Fatal(
            anyhow!("pgoutput change for relation {id} before its Relation message").into(),
        )),
    }
}

struct Built {
    map: RowMap,
    /// Columns whose unchanged TOASTed value was not sent and not in the old tuple.
    missing: Vec<usize>,
}

impl Built {
    fn into_row(self) -> Row {
        Row::from_map(&self.map)
    }
}

fn cell_value(kind: &Kind, cell: &Cell) -> Option<larch_archive::value::Value> {
    match cell {
        Cell::Null => Some(raw("null")),
        Cell::Text(t) => Some(to_json(kind, t)),
        Cell::Unchanged => None,
    }
}

fn build_row(r: &Rel, cells: &[Cell], old: Option<&OldTuple>) -> Built {
    let mut map = RowMap::new();
    let mut missing = Vec::new();
    for (i, col) in r.columns.iter().enumerate() {
        let kind = r.kinds.get(i).unwrap_or(&Kind::Text);
        let cell = cells.get(i).unwrap_or(&Cell::Null);
        let value = cell_value(kind, cell).or_else(|| match old {
            // W8: an unchanged TOASTed value is the old row's value (REPLICA IDENTITY FULL).
            Some(OldTuple::Full(o)) => o.get(i).and_then(|c| cell_value(kind, c)),
            _ => None,
        });
        match value {
            Some(v) => {
                map.insert(col.name.clone(), v);
            }
            None => missing.push(i),
        }
    }
    Built { map, missing }
}

/// The old row of a delete or key change: the whole row (REPLICA IDENTITY FULL) or the
/// replica identity columns only.
fn old_row(r: &Rel, old: &OldTuple) -> Row {
    let mut map = RowMap::new();
    for (i, col) in r.columns.iter().enumerate() {
        let kind = r.kinds.get(i).unwrap_or(&Kind::Text);
        let cell = old.cells().get(i).unwrap_or(&Cell::Null);
        let include = match old {
            OldTuple::Full(_) => true,
            OldTuple::Key(_) => col.key,
        };
        if include && let Some(v) = cell_value(kind, cell) {
            map.insert(col.name.clone(), v);
        }
    }
    Row::from_map(&map)
}

fn key_differs(r: &Rel, schema: &TableSchema, old: &[Cell], new: &[Cell]) -> bool {
    schema.key_fields.iter().any(|k| {
        let Some(i) = r.columns.iter().position(|c| &c.name == k) else {
            return false;
        };
        match (old.get(i), new.get(i)) {
            (Some(Cell::Text(a)), Some(Cell::Text(b))) => a != b,
            (Some(Cell::Null), Some(Cell::Text(_))) | (Some(Cell::Text(_)), Some(Cell::Null)) => {
                // A key-only old tuple has NULL in non-identity columns: not a change.
                r.columns[i].key
            }
            _ => false,
        }
    })
}

/// W8 without an old tuple: reads the current values of the missing columns by key. Caveat:
/// this is the value at read time, which can be newer than the change (a later transaction's
/// value, delivered again with that transaction) or gone (the row was deleted later: the
/// column becomes null, and the later delete follows). Bounded: one row per update.
async fn fill_unchanged(
    inner: &Inner,
    r: &Rel,
    schema: Option<&TableSchema>,
    new: &[Cell],
    old: Option<&OldTuple>,
    built: &mut Built,
) -> Result<(), Failure> {
    let names: Vec<String> = built
        .missing
        .iter()
        .map(|&i| r.columns[i].name.clone())
        .collect();
    let fetched = match schema {
        Some(s) => fetch_columns(inner, r, s, new, old, &names).await?,
        None => None,
    };
    match fetched {
        Some(values) => {
            for (&i, v) in built.missing.iter().zip(values) {
                let kind = r.kinds.get(i).unwrap_or(&Kind::Text);
                let value = match v {
                    Some(text) => to_json(kind, &text),
                    None => raw("null"),
                };
                built.map.insert(r.columns[i].name.clone(), value);
            }
        }
        None => {
            tracing::warn!(table = %r.table, columns = ?names, "unchanged TOASTed columns could not be read back (row gone or no key): stored as null");
            for &i in &built.missing {
                built.map.insert(r.columns[i].name.clone(), raw("null"));
            }
        }
    }
    built.missing.clear();
    Ok(())
}

async fn fetch_columns(
    inner: &Inner,
    r: &Rel,
    s: &TableSchema,
    new: &[Cell],
    old: Option<&OldTuple>,
    names: &[String],
) -> Result<Option<Vec<Option<String>>>, Failure> {
    let mut conds = Vec::new();
    let mut params: Vec<String> = Vec::new();
    for k in &s.key_fields {
        let Some(i) = r.columns.iter().position(|c| &c.name == k) else {
            return Ok(None);
        };
        let value = match (new.get(i), old.and_then(|o| o.cells().get(i))) {
            (Some(Cell::Text(t)), _) => Some(t.clone()),
            (Some(Cell::Unchanged), Some(Cell::Text(t))) => Some(t.clone()),
            (Some(Cell::Null), _) => None,
            _ => return Ok(None),
        };
        let sql_type = s
            .column_index(k)
            .map(|j| s.sql_types[j].clone())
            .unwrap_or_else(|| "text".into());
        // `=` (not IS NOT DISTINCT FROM) so the primary key's index serves the look-up.
        match value {
            Some(v) => {
                params.push(v);
                conds.push(format!(
                    "{} = CAST(${}::text AS {sql_type})",
                    ident(k),
                    params.len()
                ));
            }
            None => conds.push(format!("{} IS NULL", ident(k))),
        }
    }
    let cols: Vec<String> = names
        .iter()
        .map(|n| format!("{}::text", ident(n)))
        .collect();
    let sql = format!(
        "SELECT {} FROM {} WHERE {}",
        cols.join(", "),
        qualified(&r.table),
        conds.join(" AND ")
    );
    let client = inner.client().await.map_err(Failure::Transient)?;
    let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params
        .iter()
        .map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect();
    let row = client.query_opt(&sql, &refs).await.map_err(|e| {
        Failure::Transient(schema::db_error(
            format!("reading unchanged TOASTed columns of {}", r.table),
            &e,
        ))
    })?;
    Ok(row.map(|row| {
        (0..names.len())
            .map(|i| row.get::<_, Option<String>>(i))
            .collect()
    }))
}
