//! Targets: where a pipeline puts the table. `memory` (indexed, served over HTTP) and
//! `postgres` (a database table, durable). Each target passes the conformance suite of the
//! [`Target`] contract in `tests/it/target_conformance.rs` (PostgreSQL on a real server).

pub mod memory;
mod packed_rows;
pub mod postgres;
pub mod postgres_alter;
pub mod postgres_copy;
pub mod postgres_sql;

use async_trait::async_trait;

use larch_archive::model::ColumnDefinition;
use larch_archive::source::ChangeEvent;
use larch_archive::value::Row;

/// What a durable target holds after a restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resume {
    /// It records no position of its own: the source's state file decides.
    Unrecorded,
    /// Nothing it can vouch for (why, for the log): take a baseline, whatever the state file says.
    Baseline(String),
    /// The changes up to this position, recorded with the rows of the table it holds now.
    At(String),
}

/// A pipeline's destination. A baseline is built *aside* (`begin_baseline`, `baseline_rows`)
/// and replaces the live state atomically in `commit_baseline` (rule C2): readers see the
/// old state or the new one, never a partial or empty table.
#[async_trait]
pub trait Target: Send + Sync {
    /// `memory` or `postgres` (the last part of pipeline ids).
    fn kind(&self) -> &'static str;
    /// Whether applied changes survive a restart (only durable targets confirm positions).
    fn is_durable(&self) -> bool;
    /// The table's columns and effective key fields (called before every baseline).
    async fn init(&self, columns: &[ColumnDefinition], key_fields: &[String])
    -> anyhow::Result<()>;
    /// This target cannot resume: only a baseline may bring it in line with the archive (the
    /// PostgreSQL target's table must change to the archive's columns, atomically with rows).
    fn needs_baseline(&self) -> bool {
        false
    }
    /// What this target durably holds after a restart (C3: a recorded position wins over the
    /// state file). Called after `init`.
    async fn resume_position(&self) -> anyhow::Result<Resume> {
        Ok(Resume::Unrecorded)
    }
    async fn begin_baseline(&self) -> anyhow::Result<()>;
    async fn baseline_rows(&self, rows: Vec<Row>) -> anyhow::Result<()>;
    async fn commit_baseline(&self, position: &str) -> anyhow::Result<()>;
    /// Drops a baseline in progress (the live state is untouched).
    async fn abort_baseline(&self);
    /// Applies one change (a durable target may hold it until the next checkpoint).
    async fn apply(&self, change: &ChangeEvent) -> anyhow::Result<()>;
    /// Drops changes applied since the last checkpoint that are not visible yet (the stream
    /// is restarted from that checkpoint).
    async fn discard_pending(&self) {}
    /// Everything up to `position` has been delivered: make it visible (and durable).
    async fn checkpoint(&self, position: &str) -> anyhow::Result<()>;
    /// Rows currently served, when cheap to know.
    fn row_count(&self) -> Option<u64> {
        None
    }
    /// The configured fields this target indexes (each must be a column of the table).
    fn index_fields(&self) -> &[String] {
        &[]
    }
}
