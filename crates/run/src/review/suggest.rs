//! `larch transform suggest`: every column of the tables reviewed, by name and by a sample of
//! values, into a rules file to commit (the YAML `larch export --transform` takes) with a
//! comment on each rule saying why it was suggested. Values are read, never printed.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use tokio_postgres::Client;

use super::detect::ValueEvidence;
use super::{Suggestion, rule_yaml, suggest_column};
use larch_archive::model::TableId;
use larch_contract::transform_rules::{ColumnRule, TableRules, TransformRules};
use larch_postgres::preview;

/// What was decided for one column.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// The given rules name it: left as they say.
    Covered(ColumnRule),
    /// It looks sensitive: this rule.
    Sensitive(Suggestion),
    /// Neither its name nor its sampled values look sensitive: `keep`.
    Harmless,
}

/// One table's columns (in the table's order) and how many rows were sampled.
#[derive(Clone, Debug, PartialEq)]
pub struct TableReview {
    pub table: TableId,
    pub sampled_rows: usize,
    pub columns: Vec<(String, Decision)>,
}

/// Reviews `tables` (every table of the database when empty), sampling up to `sample` rows of
/// each; columns `existing` names are left as they are.
pub async fn review(
    client: &Client,
    tables: &[TableId],
    sample: u64,
    existing: Option<&TransformRules>,
) -> anyhow::Result<Vec<TableReview>> {
    let tables = if tables.is_empty() {
        preview::list_tables(client).await?
    } else {
        tables.to_vec()
    };
    let mut out = vec![];
    for table in tables {
        out.push(review_table(client, &table, sample, existing).await?);
    }
    Ok(out)
}

async fn review_table(
    client: &Client,
    table: &TableId,
    sample: u64,
    existing: Option<&TransformRules>,
) -> anyhow::Result<TableReview> {
    let (schema, kinds) = preview::describe(client, table).await?;
    let (rows, _) = if sample == 0 {
        (vec![], preview::Sampling::First)
    } else {
        preview::sample_rows(client, &schema, &kinds, sample, None).await?
    };
    let mut evidence: BTreeMap<&str, ValueEvidence> = BTreeMap::new();
    for row in &rows {
        let fields: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(row.raw.as_str())?;
        for c in &schema.columns {
            let text = match fields.get(&c.name) {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(v @ (serde_json::Value::Object(_) | serde_json::Value::Array(_))) => {
                    v.to_string()
                }
                _ => continue,
            };
            evidence.entry(c.name.as_str()).or_default().add(&text);
        }
    }
    let named = existing.and_then(|r| r.tables.get(&table.to_string()));
    let columns = schema
        .columns
        .iter()
        .map(|c| {
            let decision = match named.and_then(|t| t.columns.get(&c.name)) {
                Some(rule) => Decision::Covered(rule.clone()),
                None => {
                    let key = schema.key_fields.contains(&c.name);
                    match suggest_column(table, c, key, evidence.get(c.name.as_str())) {
                        Some(s) => Decision::Sensitive(s),
                        None => Decision::Harmless,
                    }
                }
            };
            (c.name.clone(), decision)
        })
        .collect();
    Ok(TableReview {
        table: table.clone(),
        sampled_rows: rows.len(),
        columns,
    })
}

/// A YAML key: plain when it is a simple name, else quoted.
fn key(name: &str) -> String {
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if plain {
        name.to_string()
    } else {
        serde_json::Value::from(name).to_string()
    }
}

/// The rules file: `existing` (from `origin`) with the reviewed tables' columns added, each
/// suggested rule commented with its reason.
pub fn render(
    reviews: &[TableReview],
    existing: Option<(&TransformRules, &str)>,
    sample: u64,
    version: &str,
) -> String {
    let sensitive = reviews
        .iter()
        .flat_map(|r| &r.columns)
        .filter(|(_, d)| matches!(d, Decision::Sensitive(_)))
        .count();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Masking rules suggested by `larch transform suggest` (larch {version}).\n\
         # {sensitive} column(s) of {} table(s) look sensitive, by their names and a sample of \
         up to {sample} rows\n# per table (read only; no value is printed). Review every rule \
         before you commit this file:\n# `keep` exports a column as it is; a column named \
         nowhere (one added later included) goes\n# through the table's `undeclared` (default \
         null).",
        reviews.len()
    );
    if existing.is_some_and(|(r, _)| r.subqueries) {
        out.push_str("subqueries: true\n");
    }
    out.push_str("tables:\n");
    let mut names: Vec<String> = reviews.iter().map(|r| r.table.to_string()).collect();
    if let Some((rules, _)) = existing {
        names.extend(rules.tables.keys().cloned());
    }
    names.sort();
    names.dedup();
    for name in names {
        let given = existing.and_then(|(r, o)| r.tables.get(&name).map(|t| (t, o)));
        let review = reviews.iter().find(|r| r.table.to_string() == name);
        render_table(&mut out, &name, given, review);
    }
    out
}

fn render_table(
    out: &mut String,
    name: &str,
    given: Option<(&TableRules, &str)>,
    review: Option<&TableReview>,
) {
    let _ = writeln!(out, "  {}:", key(name));
    if let Some((t, _)) = given {
        if t.undeclared != ColumnRule::Null {
            let _ = writeln!(out, "    undeclared: {}", rule_yaml(&t.undeclared));
        }
        if let Some(w) = &t.row_filter {
            let _ = writeln!(out, "    where: {}", serde_json::Value::from(w.as_str()));
        }
        if let Some(s) = &t.sample {
            let by = s.by.as_ref().map(|b| format!(", by: {}", key(b)));
            let _ = writeln!(
                out,
                "    sample: {{percent: {}{}}}",
                s.percent,
                by.unwrap_or_default()
            );
        }
    }
    out.push_str("    columns:\n");
    let mut lines: Vec<(String, String, Option<String>)> = vec![];
    if let Some(r) = review {
        for (column, decision) in &r.columns {
            let (rule, comment) = match decision {
                Decision::Covered(rule) => {
                    (rule_yaml(rule), given.map(|(_, o)| format!("from {o}")))
                }
                Decision::Sensitive(s) => (rule_yaml(&s.rule), Some(s.reason.clone())),
                Decision::Harmless => ("keep".to_string(), None),
            };
            lines.push((key(column), rule, comment));
        }
    }
    // Columns the given rules name that the review did not see (a table not reviewed).
    if let Some((t, origin)) = given {
        for (column, rule) in &t.columns {
            if !review.is_some_and(|r| r.columns.iter().any(|(c, _)| c == column)) {
                lines.push((key(column), rule_yaml(rule), Some(format!("from {origin}"))));
            }
        }
    }
    if lines.is_empty() {
        out.truncate(out.len() - "    columns:\n".len());
        out.push_str("    columns: {}\n");
        return;
    }
    let width = lines
        .iter()
        .map(|(c, r, _)| c.len() + r.len())
        .max()
        .unwrap_or(0)
        + 2;
    for (column, rule, comment) in lines {
        let head = format!("{column}: {rule}");
        match comment {
            Some(c) => {
                let _ = writeln!(out, "      {head:<width$}  # {c}");
            }
            None => {
                let _ = writeln!(out, "      {head}");
            }
        }
    }
}
