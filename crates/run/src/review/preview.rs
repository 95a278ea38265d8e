//! `larch transform preview`: a few rows of a table raw beside masked, for the person writing
//! the rules. The masked side is the exporter's own: the rules compiled by [`Masking`] and
//! applied by the baseline's encoder through [`TableTransform::baseline_mask`], over the same
//! COPY line as the raw side. Printed only; nothing is written anywhere.
//!
//! [`TableTransform::baseline_mask`]: crate::export::transform::TableTransform::baseline_mask

use std::fmt::Write as _;

use serde::Serialize;
use tokio_postgres::Client;

use crate::export::transform::{Masking, TransformKey};
use larch_archive::model::TableId;
use larch_contract::transform_rules::TransformRules;
use larch_postgres::{ColumnMask, preview};

/// What `preview` prints (`-o json`: this document).
#[derive(Clone, Debug, Serialize)]
pub struct Preview {
    pub table: String,
    /// `first N rows by key` or `TABLESAMPLE SYSTEM (p%)`.
    pub sampling: String,
    /// Each column and its transform as the manifest would record it.
    pub columns: Vec<PreviewColumn>,
    pub rows: Vec<PreviewRow>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PreviewColumn {
    pub name: String,
    pub transform: String,
}

/// One row: each column's raw value and masked one (absent: dropped).
#[derive(Clone, Debug, Serialize)]
pub struct PreviewRow {
    pub raw: serde_json::Map<String, serde_json::Value>,
    pub masked: serde_json::Map<String, serde_json::Value>,
}

/// Up to `rows` rows of `table` raw and through `rules` (hashing with `key`).
pub async fn preview(
    client: &Client,
    table: &TableId,
    rules: TransformRules,
    key: Option<TransformKey>,
    rows: u64,
) -> anyhow::Result<Preview> {
    let masking = Masking::new(rules, key).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (schema, kinds) = preview::describe(client, table).await?;
    let transform = masking
        .compile(&schema)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mask = transform
        .baseline_mask(&schema.columns)
        .map(|m| Box::new(m) as Box<dyn ColumnMask>);
    let (sampled, sampling) = preview::sample_rows(client, &schema, &kinds, rows, mask).await?;
    let record = transform.record();
    let columns = schema
        .columns
        .iter()
        .map(|c| PreviewColumn {
            name: c.name.clone(),
            transform: record
                .columns
                .get(&c.name)
                .cloned()
                .unwrap_or_else(|| "keep".into()),
        })
        .collect();
    let object = |text: &str| -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
        Ok(serde_json::from_str(text)?)
    };
    let mut out = vec![];
    for r in &sampled {
        out.push(PreviewRow {
            raw: object(r.raw.as_str())?,
            masked: match &r.masked {
                Some(m) => object(m.as_str())?,
                None => object(r.raw.as_str())?,
            },
        });
    }
    Ok(Preview {
        table: table.to_string(),
        sampling: match sampling {
            preview::Sampling::First if schema.key_fields.is_empty() => {
                format!("the first {} rows", out.len())
            }
            preview::Sampling::First => format!("the first {} rows by key", out.len()),
            preview::Sampling::Blocks(p) => {
                format!("{} rows of TABLESAMPLE SYSTEM ({p:.4}%)", out.len())
            }
        },
        columns,
        rows: out,
    })
}

/// A value as the table shows it: strings bare, NULL as `NULL`, at most 40 characters.
fn cell(v: Option<&serde_json::Value>) -> String {
    let text = match v {
        None => "(dropped)".to_string(),
        Some(serde_json::Value::Null) => "NULL".to_string(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    let text = text.replace(['\n', '\t', '\r'], " ");
    if text.chars().count() > 40 {
        format!("{}…", text.chars().take(39).collect::<String>())
    } else {
        text
    }
}

/// The form for people: per row, each column's transform, raw value and masked value.
pub fn table_text(p: &Preview) -> String {
    let mut out = format!(
        "preview of {} ({}): raw beside masked, printed only\n",
        p.table, p.sampling
    );
    let width = p
        .columns
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(6)
        .max(6);
    for (i, r) in p.rows.iter().enumerate() {
        let _ = writeln!(
            out,
            "\nrow {}\n  {:<width$}  {:<14}  {:<40}  MASKED",
            i + 1,
            "COLUMN",
            "TRANSFORM",
            "RAW"
        );
        for c in &p.columns {
            let _ = writeln!(
                out,
                "  {:<width$}  {:<14}  {:<40}  {}",
                c.name,
                c.transform,
                cell(r.raw.get(&c.name)),
                cell(r.masked.get(&c.name))
            );
        }
    }
    if p.rows.is_empty() {
        out.push_str("(the table has no rows)\n");
    }
    out
}
