//! One whole check as the CLI and an export with `--leak-check` run it: connect to the source,
//! check the archive's current epoch, record the result in its manifest.

use anyhow::Context;
use larch_archive::model::TableId;
use larch_archive::reader::ArchiveReader;
use larch_postgres::{PostgresConfig, Session};

use super::{LeakReport, MaskedColumn};

/// Raw values shorter than this are not looked for by default (`--min-length`).
pub const DEFAULT_MIN_LENGTH: usize = 6;

/// Checks the archive `reader` reads against the raw values in the database `dsn` reaches:
/// the masked columns are `columns`, or those its manifest's transform records. With
/// `record`, the result goes into the manifest (`transform.leak_check`).
pub async fn check_archive(
    dsn: String,
    reader: &ArchiveReader,
    columns: Option<Vec<MaskedColumn>>,
    min_length: usize,
    record: bool,
) -> anyhow::Result<LeakReport> {
    let manifest = reader.load_manifest().await?;
    let table: TableId = manifest
        .table
        .parse()
        .map_err(|e| anyhow::anyhow!("the manifest's table {:?}: {e}", manifest.table))?;
    let columns = match columns {
        Some(c) => c,
        None => super::masked_columns(&manifest)?,
    };
    let config = PostgresConfig::new(dsn, vec![table], "", "");
    let client = larch_postgres::connect(&config, Session::Snapshot)
        .await
        .context("connecting to the source database")?;
    let report = super::check(&client, reader, &manifest, &columns, min_length.max(1)).await?;
    if record {
        let entry = report.record(larch_core::version::get());
        super::record(reader, &manifest, entry).await?;
    }
    Ok(report)
}
