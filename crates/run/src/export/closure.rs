//! A subset that follows foreign keys ([`SubsetSpec`]): which tables and relationships it
//! spans, resolved against the catalog ([`resolve`]), then computed in the database at the
//! export's snapshot ([`rounds`]). docs/subsetting.md.
//!
//! The kept rows of each table are the `(tableoid, ctid)`s of its rows, in a temporary table of the
//! session that imported the export's snapshot: within one snapshot a row version's `ctid` is
//! stable (the snapshot holds back the vacuum that could move it), so every table is covered,
//! whatever its key. The closure grows by set-based `INSERT … SELECT` rounds; the COPY of each
//! table selects its kept rows in that same session (temporary tables are private to it).

pub mod at_snapshot;
pub mod estimate;
pub mod rounds;

use std::collections::{BTreeMap, BTreeSet};

use anyhow::anyhow;
use larch_archive::model::TableId;
use larch_contract::subset_spec::{NullablePolicy, SubsetSpec, table_id};
use larch_contract::transform_rules::SampleRule;
use larch_core::failure::{self, Reason};
use larch_postgres::ident;

/// A relationship between two tables: a foreign key of the catalog or a virtual one.
#[derive(Clone, Debug, PartialEq)]
pub struct Relationship {
    /// The constraint's name, or `virtualForeignKeys[i]`.
    pub name: String,
    pub child: TableId,
    /// The child's columns (empty for an expression).
    pub child_columns: Vec<String>,
    /// SQL on the child's columns, one per parent column (quoted columns, or the expression).
    pub child_exprs: Vec<String>,
    pub parent: TableId,
    pub parent_columns: Vec<String>,
    /// Every child column may be NULL (a constraint's: the catalog says).
    pub nullable: bool,
    /// A constraint checked at COMMIT when deferred (`DEFERRABLE`).
    pub deferrable: bool,
    pub is_virtual: bool,
}

impl Relationship {
    /// `public.rental(customer_id) → public.customer(id)`.
    pub fn describe(&self) -> String {
        let child = if self.child_columns.is_empty() {
            self.child_exprs.join(", ")
        } else {
            self.child_columns.join(", ")
        };
        format!(
            "{}({child}) → {}({})",
            self.child,
            self.parent,
            self.parent_columns.join(", ")
        )
    }
}

/// A relationship followed downward, and what may be added through it.
#[derive(Clone, Debug)]
pub struct Downward {
    pub relationship: usize,
    pub limit: Option<u64>,
    pub sample: Option<SampleRule>,
}

/// A root table's rows: its predicate and sample.
#[derive(Clone, Debug)]
pub struct Root {
    pub table: TableId,
    pub row_filter: Option<String>,
    pub sample: Option<SampleRule>,
}

/// The columns of a table the closure needs: names (in order), which may be NULL, its key.
#[derive(Clone, Debug, Default)]
pub struct TableInfo {
    pub columns: Vec<(String, bool)>,
    pub key: Vec<String>,
}

/// The subset resolved against the catalog: every table it exports and every relationship
/// it follows.
#[derive(Clone, Debug)]
pub struct ClosurePlan {
    /// Parents before children (the members of a cycle together).
    pub tables: Vec<TableId>,
    pub info: BTreeMap<TableId, TableInfo>,
    pub roots: Vec<Root>,
    pub relationships: Vec<Relationship>,
    /// Followed upward: a kept child keeps its parent.
    pub upward: Vec<usize>,
    /// Not followed: exported as NULL when the parent is not kept (`set-null`).
    pub set_null: Vec<usize>,
    pub downward: Vec<Downward>,
    pub max_rounds: u32,
}

fn invalid(message: String) -> anyhow::Error {
    failure::tag(Reason::InvalidConfig, anyhow!(message))
}

/// Every foreign key of the database (partitions' clones left out), composite keys in
/// column order.
pub async fn foreign_keys(client: &tokio_postgres::Client) -> anyhow::Result<Vec<Relationship>> {
    const SQL: &str = "SELECT c.conname::text, cn.nspname::text, cc.relname::text, \
         pn.nspname::text, pc.relname::text, \
         ARRAY(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY k(n, i) \
               JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY k.i), \
         ARRAY(SELECT a.attname::text FROM unnest(c.confkey) WITH ORDINALITY k(n, i) \
               JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n ORDER BY k.i), \
         NOT EXISTS (SELECT 1 FROM unnest(c.conkey) k(n) JOIN pg_attribute a \
               ON a.attrelid = c.conrelid AND a.attnum = k.n WHERE a.attnotnull), \
         c.condeferrable \
         FROM pg_constraint c \
         JOIN pg_class cc ON cc.oid = c.conrelid JOIN pg_namespace cn ON cn.oid = cc.relnamespace \
         JOIN pg_class pc ON pc.oid = c.confrelid JOIN pg_namespace pn ON pn.oid = pc.relnamespace \
         WHERE c.contype = 'f' AND c.conparentid = 0 ORDER BY 2, 3, 1";
    let rows = client
        .query(SQL, &[])
        .await
        .map_err(|e| anyhow!("reading the foreign keys from pg_constraint: {e}"))?;
    Ok(rows
        .iter()
        .map(|r| {
            let child_columns: Vec<String> = r.get(5);
            Relationship {
                name: r.get(0),
                child: TableId::new(r.get::<_, String>(1), r.get::<_, String>(2)),
                child_exprs: child_columns.iter().map(|c| ident(c)).collect(),
                child_columns,
                parent: TableId::new(r.get::<_, String>(3), r.get::<_, String>(4)),
                parent_columns: r.get(6),
                nullable: r.get(7),
                deferrable: r.get(8),
                is_virtual: false,
            }
        })
        .collect())
}

/// The columns (and whether each may be NULL) and primary key of `tables`; a table missing
/// from the result does not exist.
pub async fn table_info(
    client: &tokio_postgres::Client,
    tables: &BTreeSet<TableId>,
) -> anyhow::Result<BTreeMap<TableId, TableInfo>> {
    const SQL: &str = "SELECT n.nspname::text, c.relname::text, a.attname::text, NOT a.attnotnull, \
         coalesce(a.attnum = ANY (i.indkey), false) \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
         LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary \
         WHERE c.relkind IN ('r', 'p') AND (n.nspname || '.' || c.relname) = ANY ($1) \
         ORDER BY 1, 2, a.attnum";
    let names: Vec<String> = tables
        .iter()
        .map(|t| format!("{}.{}", t.schema, t.table))
        .collect();
    let rows = client
        .query(SQL, &[&names])
        .await
        .map_err(|e| anyhow!("reading the subset's tables from the catalog: {e}"))?;
    let mut info: BTreeMap<TableId, TableInfo> = BTreeMap::new();
    for r in rows {
        let t = TableId::new(r.get::<_, String>(0), r.get::<_, String>(1));
        let entry = info.entry(t).or_default();
        let column: String = r.get(2);
        if r.get::<_, bool>(4) {
            entry.key.push(column.clone());
        }
        entry.columns.push((column, r.get(3)));
    }
    Ok(info)
}

/// The tables the closure spans: those named (spec and `--table`s) and, transitively, the
/// parents of their relationships followed upward.
pub fn closure_tables(
    spec: &SubsetSpec,
    named: &[TableId],
    relationships: &[Relationship],
) -> BTreeSet<TableId> {
    let mut tables: BTreeSet<TableId> = spec.named_tables();
    tables.extend(named.iter().cloned());
    loop {
        let before = tables.len();
        for r in relationships {
            if tables.contains(&r.child) && followed_upward(spec, r) {
                tables.insert(r.parent.clone());
            }
        }
        if tables.len() == before {
            return tables;
        }
    }
}

fn followed_upward(spec: &SubsetSpec, r: &Relationship) -> bool {
    r.is_virtual || !r.nullable || spec.nullable_foreign_keys == NullablePolicy::IncludeParent
}

/// The spec's virtual foreign keys as relationships, checked against the tables' columns.
fn virtual_keys(
    spec: &SubsetSpec,
    info: &BTreeMap<TableId, TableInfo>,
) -> anyhow::Result<Vec<Relationship>> {
    let mut out = Vec::new();
    for (i, v) in spec.virtual_foreign_keys.iter().enumerate() {
        let at = format!("virtualForeignKeys[{i}]");
        let child = table_id(&v.table).map_err(invalid)?;
        let parent = table_id(&v.references).map_err(invalid)?;
        let child_info = existing(info, &child, &format!("{at}.table"))?;
        let parent_info = existing(info, &parent, &format!("{at}.references"))?;
        for c in &v.columns {
            has_column(child_info, &child, c, &format!("{at}.columns"))?;
        }
        for c in &v.referenced_columns {
            has_column(parent_info, &parent, c, &format!("{at}.referencedColumns"))?;
        }
        let child_exprs = match &v.expression {
            Some(e) => {
                larch_postgres::check_row_filter(&child, &format!("({e}) IS NOT NULL"))
                    .map_err(|why| invalid(format!("{at}.expression ({e}): {why}")))?;
                vec![format!("({e})")]
            }
            None => v.columns.iter().map(|c| ident(c)).collect(),
        };
        out.push(Relationship {
            name: at,
            child,
            child_columns: v.columns.clone(),
            child_exprs,
            parent,
            parent_columns: v.referenced_columns.clone(),
            nullable: false,
            deferrable: false,
            is_virtual: true,
        });
    }
    Ok(out)
}

fn existing<'a>(
    info: &'a BTreeMap<TableId, TableInfo>,
    table: &TableId,
    field: &str,
) -> anyhow::Result<&'a TableInfo> {
    info.get(table).ok_or_else(|| {
        invalid(format!(
            "{field}: table {table} does not exist (or is not a table)"
        ))
    })
}

fn has_column(info: &TableInfo, table: &TableId, column: &str, field: &str) -> anyhow::Result<()> {
    if info.columns.iter().any(|(c, _)| c == column) {
        return Ok(());
    }
    let names: Vec<&str> = info.columns.iter().map(|(c, _)| c.as_str()).collect();
    Err(invalid(format!(
        "{field}: column {column:?} of table {table} does not exist (columns: {})",
        names.join(", ")
    )))
}

/// Resolves `spec` against the catalog read through `client`: the tables it spans (besides
/// `named`), the relationships it follows, each downward rule's foreign key. Errors name the
/// spec's field.
pub async fn resolve(
    client: &tokio_postgres::Client,
    spec: &SubsetSpec,
    named: &[TableId],
) -> anyhow::Result<ClosurePlan> {
    spec.check().map_err(invalid)?;
    let catalog = foreign_keys(client).await?;
    let named_set: BTreeSet<TableId> = spec.named_tables();
    let info = table_info(client, &named_set).await?;
    for (name, _) in spec.roots.iter() {
        let t = table_id(name).map_err(invalid)?;
        existing(&info, &t, &format!("roots.{name}"))?;
    }
    for (i, t) in spec.tables.iter().enumerate() {
        existing(
            &info,
            &table_id(t).map_err(invalid)?,
            &format!("tables[{i}]"),
        )?;
    }
    let mut relationships = catalog;
    relationships.extend(virtual_keys(spec, &info)?);
    let tables = closure_tables(spec, named, &relationships);
    let info = table_info(client, &tables).await?;
    if let Some(t) = tables.iter().find(|t| !info.contains_key(*t)) {
        return Err(invalid(format!("--table {t}: the table does not exist")));
    }
    // Only what joins two of the subset's tables (a set-null key to a table outside: NULL).
    relationships.retain(|r| tables.contains(&r.child));
    plan_of(spec, tables, info, relationships)
}

/// The plan once the tables and relationships are known.
fn plan_of(
    spec: &SubsetSpec,
    tables: BTreeSet<TableId>,
    info: BTreeMap<TableId, TableInfo>,
    relationships: Vec<Relationship>,
) -> anyhow::Result<ClosurePlan> {
    let mut roots = Vec::new();
    for (name, rule) in &spec.roots {
        let table = table_id(name).map_err(invalid)?;
        if let Some(p) = &rule.row_filter {
            larch_postgres::check_row_filter(&table, p)
                .map_err(|why| invalid(format!("roots.{name}.where ({p}): {why}")))?;
        }
        if let Some(SampleRule { by: Some(c), .. }) = &rule.sample {
            has_column(&info[&table], &table, c, &format!("roots.{name}.sample.by"))?;
        }
        roots.push(Root {
            table,
            row_filter: rule.row_filter.clone(),
            sample: rule.sample.clone(),
        });
    }
    let (mut upward, mut set_null) = (Vec::new(), Vec::new());
    for (i, r) in relationships.iter().enumerate() {
        if followed_upward(spec, r) {
            upward.push(i);
        } else {
            set_null.push(i);
        }
    }
    let downward = downward_rules(spec, &relationships, &info)?;
    let order = crate::export::closure::rounds::parents_first(&tables, &relationships, &upward);
    Ok(ClosurePlan {
        tables: order.into_iter().flatten().collect(),
        info,
        roots,
        relationships,
        upward,
        set_null,
        downward,
        max_rounds: spec.max_rounds(),
    })
}

/// Each downward rule's relationship: the one from `table` to `references` (with its
/// `columns` when given); none or several is an error naming the rule.
fn downward_rules(
    spec: &SubsetSpec,
    relationships: &[Relationship],
    info: &BTreeMap<TableId, TableInfo>,
) -> anyhow::Result<Vec<Downward>> {
    let mut out = Vec::new();
    for (i, d) in spec.downward.iter().enumerate() {
        let at = format!("downward[{i}]");
        let child = table_id(&d.table).map_err(invalid)?;
        let parent = table_id(&d.references).map_err(invalid)?;
        let between: Vec<usize> = (0..relationships.len())
            .filter(|j| relationships[*j].child == child && relationships[*j].parent == parent)
            .collect();
        let matching: Vec<usize> = between
            .iter()
            .copied()
            .filter(|j| d.columns.is_empty() || relationships[*j].child_columns == d.columns)
            .collect();
        let relationship = match matching.as_slice() {
            [one] => *one,
            [] if between.is_empty() => {
                return Err(invalid(format!(
                    "{at}: no foreign key of {child} references {parent} (declare one in \
                     virtualForeignKeys if the relationship has no constraint)"
                )));
            }
            _ => {
                let found: Vec<String> = between
                    .iter()
                    .map(|j| relationships[*j].describe())
                    .collect();
                return Err(invalid(format!(
                    "{at}.columns: {} foreign key(s) of {child} reference {parent} and columns \
                     {:?} pick {} of them: {}",
                    between.len(),
                    d.columns,
                    matching.len(),
                    found.join("; ")
                )));
            }
        };
        if let Some(SampleRule { by: Some(c), .. }) = &d.sample {
            has_column(&info[&child], &child, c, &format!("{at}.sample.by"))?;
        }
        out.push(Downward {
            relationship,
            limit: d.limit,
            sample: d.sample.clone(),
        });
    }
    Ok(out)
}
