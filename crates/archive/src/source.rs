//! Sources: where changes come from, in the archive's model. `larch_postgres` (logical
//! replication) feeds exports; `larch_run::archive_source` (an archive on a store) feeds
//! engines. Both implement [`SyncSource`] and pass its conformance suite in
//! `tests/it/source_conformance.rs` (real PostgreSQL, S3 on SeaweedFS).

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use thiserror::Error;
use tokio::sync::mpsc;

use crate::model::{Action, ColumnDefinition, TableId};
use crate::value::Row;

/// One change delivered by a source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangeEvent {
    pub table: TableId,
    pub action: Action,
    /// Position after which this change is applied (for PostgreSQL: its transaction's commit
    /// LSN, W1; for an archive: the diff's `to_position`).
    pub position: String,
    pub old: Option<Row>,
    pub new: Option<Row>,
    pub commit_time: Option<DateTime<Utc>>,
}

/// What a stream delivers: changes, and position markers that carry no change (the end of a
/// transaction or diff; keepalives) so consumers can acknowledge progress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceEvent {
    Change(ChangeEvent),
    /// Everything up to and including `position` has been delivered.
    Checkpoint {
        position: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceState {
    Connecting,
    Connected,
    Baselining,
    Streaming,
    Paused,
    Error,
    Closed,
}

impl SourceState {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceState::Connecting => "CONNECTING",
            SourceState::Connected => "CONNECTED",
            SourceState::Baselining => "BASELINING",
            SourceState::Streaming => "STREAMING",
            SourceState::Paused => "PAUSED",
            SourceState::Error => "ERROR",
            SourceState::Closed => "CLOSED",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Lag {
    pub bytes: Option<u64>,
    pub time: Option<Duration>,
}

#[derive(Debug, Error)]
pub enum SourceError {
    /// The source cannot continue from the consumer's position: take a new baseline.
    #[error("re-baseline required: {0}")]
    ReBaselineRequired(String),
    /// A followed table's columns changed (a DDL): what is delivered so far is consistent, what
    /// follows has other columns. Take a new baseline with the new schema.
    #[error("schema changed: {0}")]
    SchemaChanged(String),
    /// The consumer went away (receiver dropped) or the source was closed.
    #[error("source stopped")]
    Stopped,
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl SourceError {
    pub fn is_rebaseline(&self) -> bool {
        matches!(self, SourceError::ReBaselineRequired(_))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationError {
    pub table: TableId,
    pub code: String,
    pub message: String,
}

/// laredo's SyncSource contract. Methods take `&self` so acks, pause and lag can be called
/// while a stream runs on another task.
#[async_trait]
pub trait SyncSource: Send + Sync {
    /// Connects and discovers the schema of each table.
    async fn init(
        &self,
        tables: &[TableId],
    ) -> anyhow::Result<BTreeMap<TableId, Vec<ColumnDefinition>>>;
    async fn validate_tables(&self, tables: &[TableId]) -> Vec<ValidationError>;
    /// Sends every row of the consistent baseline and returns its position.
    async fn baseline(
        &self,
        tables: &[TableId],
        rows: mpsc::Sender<(TableId, Row)>,
    ) -> Result<String, SourceError>;
    /// Streams events after `from` until closed, cancelled or failed.
    async fn stream(
        &self,
        from: &str,
        events: mpsc::Sender<SourceEvent>,
    ) -> Result<(), SourceError>;
    /// Everything up to `position` is durable downstream.
    async fn ack(&self, position: &str) -> anyhow::Result<()>;
    async fn last_acked_position(&self) -> anyhow::Result<Option<String>>;
    fn supports_resume(&self) -> bool;
    fn pause(&self);
    fn resume(&self);
    fn lag(&self) -> Lag;
    fn state(&self) -> SourceState;
    async fn close(&self);
}
