//! `larch archive leak-check`: looks for every raw value of every masked column (read from the
//! source database) in every object of an archive's current epoch, in the spellings a value can
//! take, and reports how many were found per column — never the values.
//!
//! Memory stays bounded: pass 1 streams the raw values into a keyed Bloom filter (a fixed
//! number of bits per value, capped); pass 2 reads the epoch's objects and keeps only the
//! pieces the filter flags (candidates: leaks, or rare false positives), on every core; pass 3
//! streams the raw values again and confirms candidates by exact comparison.

mod filter;
mod raw;
mod run;
mod scan;

pub use run::{DEFAULT_MIN_LENGTH, check_archive};

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use larch_archive::manifest::{Manifest, format_time, now_utc};
use larch_archive::masking::{LeakCheckColumn, LeakCheckRecord};
use larch_archive::model::TableId;
use larch_archive::reader::ArchiveReader;
use serde::Serialize;

use filter::{KeyedFilter, Spellings};
use scan::{Candidate, scan_archive};

/// A masked column to check, with the transform it went through.
#[derive(Clone, Debug, Serialize)]
pub struct MaskedColumn {
    pub name: String,
    pub transform: String,
}

/// One column's result.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ColumnReport {
    pub column: String,
    pub transform: String,
    pub values_checked: u64,
    pub found: u64,
    pub occurrences: u64,
    /// The archive fields the found values were in.
    pub found_in: BTreeSet<String>,
}

/// The whole check's result.
#[derive(Clone, Debug, Serialize)]
pub struct LeakReport {
    pub table: String,
    pub epoch: i64,
    pub position: String,
    pub objects: u64,
    pub records: u64,
    pub candidates: u64,
    pub filter_bytes: usize,
    pub values_checked: u64,
    pub found: u64,
    pub columns: Vec<ColumnReport>,
    #[serde(skip)]
    pub elapsed: Duration,
}

impl LeakReport {
    /// The manifest's record of this check.
    pub fn record(&self, larch_version: &str) -> LeakCheckRecord {
        LeakCheckRecord {
            epoch: self.epoch,
            position: self.position.clone(),
            columns: self
                .columns
                .iter()
                .map(|c| {
                    let figures = LeakCheckColumn {
                        values_checked: c.values_checked,
                        found: c.found,
                    };
                    (c.column.clone(), figures)
                })
                .collect(),
            values_checked: self.values_checked,
            found: self.found,
            checked_at: format_time(&now_utc()),
            larch_version: larch_version.to_string(),
        }
    }
}

/// The masked columns the manifest's transform records (every column whose transform is not
/// `keep`); an error when it records none.
pub fn masked_columns(manifest: &Manifest) -> anyhow::Result<Vec<MaskedColumn>> {
    let Some(t) = &manifest.transform else {
        bail!(
            "the manifest of table {} records no transform (a raw archive): nothing is masked \
             to check; pass --transform FILE to name the masked columns",
            manifest.table
        );
    };
    let columns: Vec<MaskedColumn> = t
        .columns
        .iter()
        .filter(|(_, tr)| tr.as_str() != "keep")
        .map(|(c, tr)| MaskedColumn {
            name: c.clone(),
            transform: tr.clone(),
        })
        .collect();
    if columns.is_empty() {
        bail!("the transform of table {} masks no column", manifest.table);
    }
    Ok(columns)
}

/// Runs the check of `manifest`'s current epoch against the raw values of `columns` read
/// through `client`.
pub async fn check(
    client: &tokio_postgres::Client,
    reader: &ArchiveReader,
    manifest: &Manifest,
    columns: &[MaskedColumn],
    min_length: usize,
) -> anyhow::Result<LeakReport> {
    let started = Instant::now();
    let table: TableId = manifest
        .table
        .parse()
        .map_err(|e| anyhow::anyhow!("the manifest's table {:?}: {e}", manifest.table))?;
    let names: Vec<String> = columns.iter().map(|c| c.name.clone()).collect();
    let mut reports: Vec<ColumnReport> = columns
        .iter()
        .map(|c| ColumnReport {
            column: c.name.clone(),
            transform: c.transform.clone(),
            ..ColumnReport::default()
        })
        .collect();
    let filter = build_filter(client, &table, &names, manifest, min_length, &mut reports).await?;
    let filter_bytes = filter.bytes();
    tracing::debug!(elapsed = ?started.elapsed(), filter_bytes, "leak check: raw values read");
    let scan = scan_archive(reader, manifest, Arc::new(filter), min_length).await?;
    let (objects, records) = (scan.objects, scan.records);
    let candidates = scan.candidates.len() as u64;
    tracing::debug!(elapsed = ?started.elapsed(), candidates, "leak check: archive scanned");
    if candidates > 0 {
        reports = confirm(client, &table, &names, scan.candidates, min_length, reports).await?;
        tracing::debug!(elapsed = ?started.elapsed(), "leak check: candidates confirmed");
    }
    Ok(LeakReport {
        table: table.to_string(),
        epoch: manifest.epoch,
        position: manifest.head_position.clone(),
        objects,
        records,
        candidates,
        filter_bytes,
        values_checked: reports.iter().map(|c| c.values_checked).sum(),
        found: reports.iter().map(|c| c.found).sum(),
        columns: reports,
        elapsed: started.elapsed(),
    })
}

/// Pass 1: every spelling of every raw value into a filter sized by the archive's row count.
async fn build_filter(
    client: &tokio_postgres::Client,
    table: &TableId,
    names: &[String],
    manifest: &Manifest,
    min_length: usize,
    reports: &mut [ColumnReport],
) -> anyhow::Result<KeyedFilter> {
    let rows: i64 = epoch_artifacts(manifest)
        .map(|a| a.row_count + a.change_count)
        .sum();
    let expected = (rows.max(0) as u64).saturating_mul(names.len() as u64 * 3);
    let filling = Filling {
        filter: KeyedFilter::with_capacity(expected),
        spellings: Spellings::default(),
        values_checked: vec![0; names.len()],
    };
    let filled = raw::fold_values(client, table, names, filling, move |s, i, v| {
        s.spellings.of(v, min_length);
        if !s.spellings.is_empty() {
            s.values_checked[i] += 1;
        }
        for spelling in s.spellings.iter() {
            s.filter.insert(spelling);
        }
    })
    .await?;
    for (report, n) in reports.iter_mut().zip(filled.values_checked) {
        report.values_checked += n;
    }
    Ok(filled.filter)
}

/// Pass 1's state, on the thread that parses the raw values.
struct Filling {
    filter: KeyedFilter,
    spellings: Spellings,
    values_checked: Vec<u64>,
}

fn epoch_artifacts(m: &Manifest) -> impl Iterator<Item = &larch_archive::manifest::Artifact> {
    m.artifacts.iter().filter(move |a| a.epoch == m.epoch)
}

/// Pass 3: the raw values again; a candidate equal to one of a value's spellings is a leak.
/// A column masked with `fake` draws plausible values, which may equal another row's raw
/// value: a match in that column itself is not counted.
async fn confirm(
    client: &tokio_postgres::Client,
    table: &TableId,
    names: &[String],
    candidates: HashMap<String, Candidate>,
    min_length: usize,
    reports: Vec<ColumnReport>,
) -> anyhow::Result<Vec<ColumnReport>> {
    let state = (reports, Spellings::default());
    let (reports, _) = raw::fold_values(client, table, names, state, move |state, i, v| {
        let (reports, spellings) = state;
        spellings.of(v, min_length);
        let report = &mut reports[i];
        let fake = report.transform.starts_with("fake");
        let mut found = false;
        for s in spellings.iter() {
            let Some(c) = candidates.get(s) else { continue };
            if fake && c.fields.iter().all(|f| *f == report.column) {
                continue;
            }
            found = true;
            report.occurrences += c.occurrences;
            report.found_in.extend(c.fields.iter().cloned());
        }
        report.found += u64::from(found);
    })
    .await?;
    Ok(reports)
}

/// Writes `record` into the manifest's `transform.leak_check` with the manifest's
/// compare-and-swap, only if the archive is still at the epoch and head that were checked.
pub async fn record(
    reader: &ArchiveReader,
    checked: &Manifest,
    record: LeakCheckRecord,
) -> anyhow::Result<()> {
    let key = reader.manifest_key();
    let (mut m, revision) = reader
        .try_load_manifest()
        .await?
        .with_context(|| format!("{key} is gone"))?;
    if m.epoch != checked.epoch
        || !larch_archive::position::same(&m.head_position, &checked.head_position)
    {
        bail!(
            "{key} moved on during the check (epoch {} at {}, checked epoch {} at {}): the \
             result is not recorded; run the check again",
            m.epoch,
            m.head_position,
            checked.epoch,
            checked.head_position
        );
    }
    let Some(t) = m.transform.as_mut() else {
        bail!("{key} no longer records a transform: the result is not recorded");
    };
    t.leak_check = Some(record);
    reader
        .store()
        .put_cas(&key, bytes::Bytes::from(m.to_json()), &revision)
        .await
        .with_context(|| format!("recording the leak check in {key}"))?;
    Ok(())
}

/// The columns a rules file masks for `table` (every one it names with a transform other than
/// `keep`).
pub fn masked_by_rules(
    rules: &larch_contract::transform_rules::TransformRules,
    table: &TableId,
    origin: &str,
) -> anyhow::Result<Vec<MaskedColumn>> {
    let Some(t) = rules.tables.get(&table.to_string()) else {
        bail!("{origin}: no rules for table {table}");
    };
    let columns: Vec<MaskedColumn> = t
        .columns
        .iter()
        .filter(|(_, r)| r.name() != "keep")
        .map(|(c, r)| MaskedColumn {
            name: c.clone(),
            transform: r.record_name(),
        })
        .collect();
    if columns.is_empty() {
        bail!("{origin}: the rules of table {table} mask no column");
    }
    Ok(columns)
}

/// A per-column table of the result (counts only).
pub fn table_text(r: &LeakReport) -> String {
    let mut out = format!(
        "leak check of {} at {} (epoch {}): {} objects, {} records, {} values checked, {} found \
         ({:.1}s)\n",
        r.table,
        r.position,
        r.epoch,
        r.objects,
        r.records,
        r.values_checked,
        r.found,
        r.elapsed.as_secs_f64()
    );
    out.push_str(&format!(
        "{:<24} {:<14} {:>14} {:>8} {:>11}  FOUND IN\n",
        "COLUMN", "TRANSFORM", "VALUES CHECKED", "FOUND", "OCCURRENCES"
    ));
    for c in &r.columns {
        let found_in: Vec<&str> = c.found_in.iter().map(String::as_str).collect();
        out.push_str(&format!(
            "{:<24} {:<14} {:>14} {:>8} {:>11}  {}\n",
            c.column,
            c.transform,
            c.values_checked,
            c.found,
            c.occurrences,
            if found_in.is_empty() {
                "-".to_string()
            } else {
                found_in.join(", ")
            }
        ));
    }
    out
}
