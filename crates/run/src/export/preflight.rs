//! `larch export --check`: before anything is exported, which constraints of the source's
//! tables (PRIMARY KEY / UNIQUE, NOT NULL, CHECK, FOREIGN KEY) the masking rules can break,
//! so that a restore of the masked archive into a database with every constraint enabled
//! succeeds. Reads the catalog and a sample of rows; writes nothing (a read-only session).
//!
//! - NOT NULL: `null`, `{redact: null}`, or `drop` of a column without a default.
//! - UNIQUE / PRIMARY KEY: a transform that can map two values to one: `redact`, `fake`,
//!   `hash` on text or uuid (`hash` on integers and `permute` are permutations), `null` under
//!   `NULLS NOT DISTINCT`.
//! - CHECK: a constraint over a transformed column is evaluated on the transformed values of
//!   a sample of rows, in a SELECT.
//! - FOREIGN KEY: a referencing column transformed differently from the column it references
//!   (a NULL always satisfies a foreign key).

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::anyhow;
use larch_archive::model::{ColumnDefinition, TableId};
use larch_archive::value::Row;
use serde::Serialize;
use tokio_postgres::Client;

use super::transform::{CompileRules, TransformKey, TransformRules};
use larch_contract::transform_rules::{ColumnRule, TableRules};

mod catalog;
use catalog::{Constraint, Kind};

/// Rows sampled per table to evaluate its CHECK constraints.
pub const SAMPLE_ROWS: i64 = 1000;

/// What `--check` found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PreflightReport {
    pub tables: Vec<String>,
    /// Constraints looked at (NOT NULL columns counted one each).
    pub constraints_checked: usize,
    pub problems: Vec<Problem>,
}

/// A constraint the transform can break.
#[derive(Clone, Debug, Serialize)]
pub struct Problem {
    pub table: String,
    pub constraint: String,
    pub kind: &'static str,
    pub columns: Vec<String>,
    pub why: String,
}

impl Problem {
    /// `table.constraint (KIND): why`; a NOT NULL problem names its column.
    pub fn line(&self) -> String {
        let name = match self.kind {
            "NOT NULL" => self.columns.join(","),
            _ => self.constraint.clone(),
        };
        format!("{}.{name} ({}): {}", self.table, self.kind, self.why)
    }
}

/// One table's columns and rules, as the checks need them.
struct TableInfo {
    id: TableId,
    columns: Vec<ColumnDefinition>,
    rules: TableRules,
}

impl TableInfo {
    fn rule(&self, column: &str) -> &ColumnRule {
        self.rules
            .columns
            .get(column)
            .unwrap_or(&self.rules.undeclared)
    }

    fn column(&self, name: &str) -> Option<&ColumnDefinition> {
        self.columns.iter().find(|c| c.name == name)
    }
}

/// Checks `tables` under `rules`. An error is bad input (a table the rules do not name, a
/// rule the export would refuse for its type or key, an unreachable catalog); the problems
/// are what the transform can break.
pub async fn check(
    client: &Client,
    rules: &TransformRules,
    tables: &[TableId],
    key_fields: &[String],
    key: Option<Arc<TransformKey>>,
) -> anyhow::Result<PreflightReport> {
    // Belt and braces: the CHECK expressions come from the catalog, but nothing here writes.
    client
        .batch_execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        .await
        .map_err(|e| {
            anyhow!(
                "starting a read-only session: {}",
                larch_postgres::errors::message(&e)
            )
        })?;
    let mut report = PreflightReport {
        tables: tables.iter().map(ToString::to_string).collect(),
        ..Default::default()
    };
    let mut referenced: BTreeMap<TableId, Option<TableInfo>> = BTreeMap::new();
    for table in tables {
        let info = table_info(client, rules, table, key_fields).await?;
        let constraints = catalog::constraints(client, table).await?;
        report.constraints_checked +=
            constraints.len() + info.columns.iter().filter(|c| !c.nullable).count();
        not_null(&info, &mut report.problems);
        for c in &constraints {
            match c.kind {
                Kind::PrimaryKey | Kind::Unique => unique(&info, c, &mut report.problems),
                Kind::ForeignKey => {
                    let (ref_table, _) = c.references.as_ref().expect("a foreign key references");
                    if !referenced.contains_key(ref_table) {
                        let found = match rules.tables.contains_key(&ref_table.to_string()) {
                            true => Some(table_info(client, rules, ref_table, &[]).await?),
                            false => None,
                        };
                        referenced.insert(ref_table.clone(), found);
                    }
                    let target = referenced[ref_table].as_ref();
                    foreign_key(&info, c, target, &mut report.problems);
                }
                Kind::Check => {}
            }
        }
        checks(
            client,
            &info,
            &constraints,
            key.clone(),
            &mut report.problems,
        )
        .await?;
    }
    Ok(report)
}

/// The table's columns and its rules; the rules must name it and its columns, and compile
/// for their types (NOT NULL and key fields aside: those are this check's findings).
async fn table_info(
    client: &Client,
    rules: &TransformRules,
    table: &TableId,
    key_fields: &[String],
) -> anyhow::Result<TableInfo> {
    let schema = larch_postgres::discover(client, table, key_fields).await?;
    let table_rules = rules
        .tables
        .get(&table.to_string())
        .cloned()
        .ok_or_else(|| {
            anyhow!(
                "the transform rules have no entry for table {table} (they name: {})",
                rules.tables.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })?;
    Ok(TableInfo {
        id: table.clone(),
        columns: schema.columns,
        rules: table_rules,
    })
}

fn problem(
    info: &TableInfo,
    name: &str,
    kind: &'static str,
    columns: &[String],
    why: String,
) -> Problem {
    Problem {
        table: info.id.to_string(),
        constraint: name.to_string(),
        kind,
        columns: columns.to_vec(),
        why,
    }
}

/// The rule's output when it makes every value alike: Some(true) for NULL, Some(false) for
/// a non-NULL constant; None when values differ.
fn constant(rule: &ColumnRule, column: &ColumnDefinition) -> Option<bool> {
    match rule {
        ColumnRule::Null => Some(true),
        ColumnRule::Redact(v) => Some(v.is_null()),
        // A dropped column restores as its default.
        ColumnRule::Drop => Some(column.default_value.is_none()),
        _ => None,
    }
}

fn not_null(info: &TableInfo, problems: &mut Vec<Problem>) {
    for c in info.columns.iter().filter(|c| !c.nullable) {
        let rule = info.rule(&c.name);
        if constant(rule, c) == Some(true) {
            let why = match rule {
                ColumnRule::Drop => "drop: the column is restored as NULL (it has no default)",
                ColumnRule::Redact(_) => "redact: NULL on a NOT NULL column",
                _ => "null on a NOT NULL column",
            };
            problems.push(problem(
                info,
                "NOT NULL",
                "NOT NULL",
                std::slice::from_ref(&c.name),
                why.into(),
            ));
        }
    }
}

/// Why `rule` can map two distinct values of `column` to one, if it can.
fn collides(
    rule: &ColumnRule,
    column: &ColumnDefinition,
    nulls_not_distinct: bool,
) -> Option<String> {
    let int = matches!(column.type_name.as_str(), "int2" | "int4" | "int8");
    match rule {
        ColumnRule::Keep | ColumnRule::Permute => None,
        ColumnRule::Hash if int => None,
        ColumnRule::Hash => Some(format!(
            "hash on {} is not unique: two values can hash alike (use permute)",
            column.type_name
        )),
        ColumnRule::Fake(kind) => Some(format!(
            "fake {kind} draws from a fixed list: two values can get one fake (use permute)"
        )),
        _ => match constant(rule, column) {
            Some(true) if !nulls_not_distinct => None,
            Some(true) => Some(format!(
                "{}: every value NULL, and NULLs do not differ here",
                rule.name()
            )),
            _ => Some(format!("{}: every value the same constant", rule.name())),
        },
    }
}

fn unique(info: &TableInfo, c: &Constraint, problems: &mut Vec<Problem>) {
    for name in &c.columns {
        let Some(column) = info.column(name) else {
            continue;
        };
        if let Some(why) = collides(info.rule(name), column, c.nulls_not_distinct) {
            let why = format!("column {name:?}: {why}");
            problems.push(problem(info, &c.name, c.kind.label(), &c.columns, why));
        }
    }
}

/// Whether a referencing column under `from` still equals the referenced one under `to`.
fn joins(
    from: &ColumnRule,
    from_col: &ColumnDefinition,
    to: &ColumnRule,
    to_col: &ColumnDefinition,
) -> bool {
    use ColumnRule as R;
    let same_type = from_col.type_name == to_col.type_name;
    let int = |c: &ColumnDefinition| matches!(c.type_name.as_str(), "int2" | "int4" | "int8");
    match (from, to) {
        (R::Keep, R::Keep) => true,
        // Integers: hash and permute are one permutation per type.
        (R::Hash | R::Permute, R::Hash | R::Permute) if int(from_col) && int(to_col) => same_type,
        (R::Hash, R::Hash) | (R::Permute, R::Permute) => {
            (from_col.type_name == "uuid") == (to_col.type_name == "uuid")
        }
        (R::Fake(a), R::Fake(b)) => a == b,
        (R::Redact(a), R::Redact(b)) => a == b,
        _ => false,
    }
}

fn foreign_key(
    info: &TableInfo,
    c: &Constraint,
    target: Option<&TableInfo>,
    problems: &mut Vec<Problem>,
) {
    let (ref_table, ref_columns) = c.references.as_ref().expect("a foreign key references");
    for (name, ref_name) in c.columns.iter().zip(ref_columns) {
        let Some(column) = info.column(name) else {
            continue;
        };
        let rule = info.rule(name);
        // NULL satisfies a foreign key.
        if constant(rule, column) == Some(true) {
            continue;
        }
        let why = match target {
            None if *rule == ColumnRule::Keep => continue,
            None => format!(
                "column {name:?} is transformed ({}) but the rules do not name {ref_table}: its \
                 {ref_name:?} is not transformed alike",
                rule.record_name()
            ),
            Some(t) => {
                let Some(ref_column) = t.column(ref_name) else {
                    continue;
                };
                let ref_rule = t.rule(ref_name);
                if joins(rule, column, ref_rule, ref_column) {
                    continue;
                }
                format!(
                    "column {name:?} ({} {}) and {ref_table}.{ref_name:?} ({} {}) are \
                     transformed differently: the references would not join",
                    rule.record_name(),
                    column.type_name,
                    ref_rule.record_name(),
                    ref_column.type_name
                )
            }
        };
        problems.push(problem(info, &c.name, c.kind.label(), &c.columns, why));
    }
}

/// Every CHECK over a transformed column, evaluated on the transformed sample.
async fn checks(
    client: &Client,
    info: &TableInfo,
    constraints: &[Constraint],
    key: Option<Arc<TransformKey>>,
    problems: &mut Vec<Problem>,
) -> anyhow::Result<()> {
    let transformed = |c: &&Constraint| {
        c.kind == Kind::Check && c.columns.iter().any(|n| *info.rule(n) != ColumnRule::Keep)
    };
    let relevant: Vec<&Constraint> = constraints.iter().filter(transformed).collect();
    if relevant.is_empty() {
        return Ok(());
    }
    let mut columns: Vec<String> = relevant.iter().flat_map(|c| c.columns.clone()).collect();
    columns.sort();
    columns.dedup();
    let rows = catalog::sample_rows(client, &info.id, &columns, SAMPLE_ROWS).await?;
    let masked = mask_sample(info, rows, key)?;
    for c in relevant {
        let expression = c.expression.as_deref().unwrap_or("true");
        let why = match catalog::failing_check(client, &info.id, expression, &masked).await {
            Ok(0) => continue,
            Ok(n) => format!(
                "{n} of {} sampled rows fail it once transformed ({})",
                masked.len(),
                describe_rules(info, &c.columns)
            ),
            Err(e) => format!("evaluating it on the transformed sample failed: {e}"),
        };
        problems.push(problem(info, &c.name, "CHECK", &c.columns, why));
    }
    Ok(())
}

/// The sample's rows through the table's transform. NOT NULL and key fields are this check's
/// findings, not reasons to refuse, so the transform is compiled without them.
fn mask_sample(
    info: &TableInfo,
    rows: Vec<String>,
    key: Option<Arc<TransformKey>>,
) -> anyhow::Result<Vec<String>> {
    let lenient: Vec<ColumnDefinition> = info
        .columns
        .iter()
        .map(|c| ColumnDefinition {
            nullable: true,
            ..c.clone()
        })
        .collect();
    let mut rules = TransformRules::default();
    rules.tables.insert(info.id.to_string(), info.rules.clone());
    let t = rules.compile(&info.id, &lenient, &[], key)?;
    rows.iter()
        .map(|r| {
            let row = Row::parse(r).map_err(|e| anyhow!("a sampled row of {}: {e}", info.id))?;
            Ok(t.apply(row)?.as_str().to_string())
        })
        .collect()
}

fn describe_rules(info: &TableInfo, columns: &[String]) -> String {
    columns
        .iter()
        .map(|c| format!("{c}: {}", info.rule(c).record_name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The report as a table for a terminal.
pub fn table_text(r: &PreflightReport) -> String {
    let mut out = format!(
        "checked {} constraints of {}: ",
        r.constraints_checked,
        r.tables.join(", ")
    );
    if r.problems.is_empty() {
        out.push_str("the transform breaks none\n");
        return out;
    }
    out.push_str(&format!("{} can break\n", r.problems.len()));
    out.push_str(&format!(
        "{:<20} {:<28} {:<12} {:<20} WHY\n",
        "TABLE", "CONSTRAINT", "KIND", "COLUMNS"
    ));
    for p in &r.problems {
        out.push_str(&format!(
            "{:<20} {:<28} {:<12} {:<20} {}\n",
            p.table,
            p.constraint,
            p.kind,
            p.columns.join(","),
            p.why
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, ty: &str, default: Option<&str>) -> ColumnDefinition {
        ColumnDefinition {
            name: name.into(),
            type_name: ty.into(),
            default_value: default.map(String::from),
            ..Default::default()
        }
    }

    fn rule(yaml: &str) -> ColumnRule {
        let text = format!("tables:\n  public.t:\n    columns: {{c: {yaml}}}\n");
        let rules = TransformRules::parse(&text, "test").unwrap();
        rules.tables["public.t"].columns["c"].clone()
    }

    #[test]
    fn which_rules_can_make_two_values_one() {
        let text = col("email", "text", None);
        let int = col("id", "int8", None);
        assert_eq!(collides(&ColumnRule::Permute, &text, false), None);
        assert_eq!(collides(&ColumnRule::Keep, &text, true), None);
        assert_eq!(collides(&ColumnRule::Hash, &int, false), None);
        assert!(
            collides(&ColumnRule::Hash, &text, false)
                .unwrap()
                .contains("use permute")
        );
        assert!(collides(&ColumnRule::Hash, &col("t", "uuid", None), false).is_some());
        assert!(collides(&rule("{fake: city}"), &text, false).is_some());
        assert!(collides(&rule("{redact: x}"), &text, false).is_some());
        // NULLs differ in a UNIQUE constraint unless NULLS NOT DISTINCT.
        assert_eq!(collides(&ColumnRule::Null, &text, false), None);
        assert!(collides(&ColumnRule::Null, &text, true).is_some());
        // A dropped column restores as its default: NULL, or one constant.
        assert_eq!(collides(&ColumnRule::Drop, &text, false), None);
        assert!(
            collides(
                &ColumnRule::Drop,
                &col("c", "text", Some("'x'::text")),
                false
            )
            .is_some()
        );
    }

    #[test]
    fn which_rules_keep_references_joining() {
        let (i8a, i8b, i4) = (
            col("a", "int8", None),
            col("b", "int8", None),
            col("c", "int4", None),
        );
        let (t, v, u) = (
            col("t", "text", None),
            col("v", "varchar", None),
            col("u", "uuid", None),
        );
        use ColumnRule as R;
        assert!(
            joins(&R::Hash, &i8a, &R::Permute, &i8b),
            "one permutation per type"
        );
        assert!(
            !joins(&R::Hash, &i4, &R::Hash, &i8b),
            "int4 and int8 permute differently"
        );
        assert!(joins(&R::Permute, &v, &R::Permute, &t));
        assert!(!joins(&R::Hash, &t, &R::Permute, &t));
        assert!(!joins(&R::Permute, &t, &R::Permute, &u));
        assert!(joins(&R::Keep, &u, &R::Keep, &u));
        assert!(!joins(&R::Keep, &u, &R::Permute, &u));
        assert!(joins(
            &rule("{fake: email}"),
            &t,
            &rule("{fake: email}"),
            &v
        ));
        assert!(!joins(
            &rule("{fake: email}"),
            &t,
            &rule("{fake: city}"),
            &t
        ));
    }
}
