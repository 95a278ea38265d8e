//! The closure computed in the database: roots, then rounds of set-based `INSERT … SELECT`
//! into each table's kept-rows temporary table (semi-naive: a round reads only the rows the
//! previous one added), until a round adds nothing. Nothing but counts comes back to the
//! client, so memory does not grow with the subset.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::anyhow;
use larch_archive::model::TableId;
use larch_contract::transform_rules::SampleRule;
use larch_core::failure::{self, Reason};
use larch_postgres::{ident, qualified};
use tokio_postgres::Client;

use super::{ClosurePlan, Relationship};

/// What the closure kept, for the manifests and the summary.
#[derive(Clone, Debug, Default)]
pub struct ClosureReport {
    /// Rounds after the roots until nothing was added.
    pub rounds: u32,
    pub kept: BTreeMap<TableId, u64>,
}

/// The kept-rows temporary table of the plan's `i`-th table.
fn kept(i: usize) -> String {
    format!("pg_temp.larch_kept_{i}")
}

/// Creates the kept-rows tables (run before the snapshot's READ ONLY transaction begins).
pub fn prepare_sql(plan: &ClosurePlan) -> String {
    (0..plan.tables.len())
        .map(|i| {
            format!(
                "CREATE TEMPORARY TABLE larch_kept_{i} (row_rel oid NOT NULL, row_id tid NOT NULL, \
                 round int NOT NULL, PRIMARY KEY (row_rel, row_id)); \
                 CREATE INDEX ON larch_kept_{i} (round);"
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The sample as SQL over `alias`'s columns `by`: a hash of their text seeded by `seed`,
/// deterministic, and alike in every table for the same values.
fn sample_sql(alias: &str, by: &[String], sample: &SampleRule, seed: i64) -> String {
    let parts: Vec<String> = by
        .iter()
        .map(|c| format!("coalesce({alias}.{}::text, 'null')", ident(c)))
        .collect();
    let threshold = (sample.percent / 100.0 * 1_000_000.0).round() as i64;
    format!(
        "abs(hashtextextended(concat_ws(chr(31), {}), {seed}) % 1000000) < {threshold}",
        parts.join(", ")
    )
}

/// The columns a sample of `table` is decided by: its `by`, else the table's key.
fn sample_by(plan: &ClosurePlan, table: &TableId, sample: &SampleRule) -> Vec<String> {
    match &sample.by {
        Some(c) => vec![c.clone()],
        None => plan.info[table].key.clone(),
    }
}

impl ClosurePlan {
    fn index(&self, table: &TableId) -> usize {
        self.tables
            .iter()
            .position(|t| t == table)
            .expect("a table of the plan")
    }
}

/// `table`'s rows as `(larch_row_rel, larch_row_id, larch_k0, …)` on `exprs`. A row is its
/// relation and `ctid`: a partitioned table's partitions each number their own pages.
fn keyed(table: &TableId, exprs: &[String]) -> String {
    let keys: Vec<String> = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| format!("{e} AS larch_k{i}"))
        .collect();
    format!(
        "(SELECT tableoid AS larch_row_rel, ctid AS larch_row_id, {} FROM {})",
        keys.join(", "),
        qualified(table)
    )
}

fn joined(r: &Relationship) -> String {
    (0..r.parent_columns.len())
        .map(|i| format!("p.larch_k{i} = c.larch_k{i}"))
        .collect::<Vec<_>>()
        .join(" AND ")
}

fn parent_exprs(r: &Relationship) -> Vec<String> {
    r.parent_columns.iter().map(|c| ident(c)).collect()
}

/// The roots' rows (round 0).
fn root_sql(plan: &ClosurePlan, root: &super::Root, seed: i64) -> String {
    let mut conditions = vec!["true".to_string()];
    if let Some(p) = &root.row_filter {
        conditions.push(format!("({p})"));
    }
    if let Some(s) = &root.sample {
        conditions.push(sample_sql("t", &sample_by(plan, &root.table, s), s, seed));
    }
    format!(
        "INSERT INTO {} (row_rel, row_id, round) SELECT t.tableoid, t.ctid, 0 FROM {} t WHERE {} \
         ON CONFLICT DO NOTHING",
        kept(plan.index(&root.table)),
        qualified(&root.table),
        conditions.join(" AND ")
    )
}

/// The parents of the child rows the previous round added.
fn upward_sql(plan: &ClosurePlan, r: &Relationship, round: u32) -> String {
    format!(
        "INSERT INTO {parent_kept} (row_rel, row_id, round) \
         SELECT p.larch_row_rel, p.larch_row_id, {round} FROM {child_kept} k \
         JOIN {c} c ON c.larch_row_rel = k.row_rel AND c.larch_row_id = k.row_id JOIN {p} p ON {on} \
         WHERE k.round = {prev} ON CONFLICT DO NOTHING",
        parent_kept = kept(plan.index(&r.parent)),
        child_kept = kept(plan.index(&r.child)),
        c = keyed(&r.child, &r.child_exprs),
        p = keyed(&r.parent, &parent_exprs(r)),
        on = joined(r),
        prev = round - 1,
    )
}

/// The child rows referencing the parent rows the previous round added, sampled and capped
/// at `remaining` (None: no cap).
fn downward_sql(
    plan: &ClosurePlan,
    d: &super::Downward,
    round: u32,
    remaining: Option<u64>,
    seed: i64,
) -> String {
    let r = &plan.relationships[d.relationship];
    let child_kept = kept(plan.index(&r.child));
    let mut child_exprs = r.child_exprs.clone();
    let mut sample = String::new();
    if let Some(s) = &d.sample {
        // The sample reads the child's columns: computed inside its keyed subquery.
        let by = sample_by(plan, &r.child, s);
        child_exprs.push(sample_sql(&qualified(&r.child), &by, s, seed));
        sample = format!(" AND c.larch_k{}", r.child_exprs.len());
    }
    let limit = remaining.map(|n| format!(" LIMIT {n}")).unwrap_or_default();
    format!(
        "INSERT INTO {child_kept} (row_rel, row_id, round) \
         SELECT c.larch_row_rel, c.larch_row_id, {round} FROM {parent_kept} k \
         JOIN {p} p ON p.larch_row_rel = k.row_rel AND p.larch_row_id = k.row_id JOIN {c} c ON {on} \
         WHERE k.round = {prev}{sample} AND NOT EXISTS \
         (SELECT 1 FROM {child_kept} x WHERE x.row_rel = c.larch_row_rel AND x.row_id = c.larch_row_id){limit} \
         ON CONFLICT DO NOTHING",
        parent_kept = kept(plan.index(&r.parent)),
        p = keyed(&r.parent, &parent_exprs(r)),
        c = keyed(&r.child, &child_exprs),
        on = joined(r),
        prev = round - 1,
    )
}

async fn execute(client: &Client, sql: &str) -> anyhow::Result<u64> {
    client.execute(sql, &[]).await.map_err(|e| {
        anyhow!(
            "computing the subset's closure: {}",
            larch_postgres::errors::message(&e)
        )
    })
}

/// Computes the closure of `plan` in `client`'s session (its kept-rows tables made by
/// [`prepare_sql`], its transaction in the export's snapshot). `seed` keys the samples.
pub async fn compute(
    client: &Client,
    plan: &ClosurePlan,
    seed: i64,
    deadline: std::time::Instant,
) -> anyhow::Result<ClosureReport> {
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    client
        .batch_execute(&format!(
            "SET statement_timeout = {}",
            left.as_millis().max(1)
        ))
        .await
        .map_err(|e| anyhow!("computing the subset's closure: {e}"))?;
    for root in &plan.roots {
        execute(client, &root_sql(plan, root, seed)).await?;
    }
    let mut added_by_rule = vec![0u64; plan.downward.len()];
    let mut round = 1;
    loop {
        let mut grew: BTreeSet<TableId> = BTreeSet::new();
        for &u in &plan.upward {
            let r = &plan.relationships[u];
            if execute(client, &upward_sql(plan, r, round)).await? > 0 {
                grew.insert(r.parent.clone());
            }
        }
        for (i, d) in plan.downward.iter().enumerate() {
            let remaining = d.limit.map(|l| l.saturating_sub(added_by_rule[i]));
            if remaining == Some(0) {
                continue;
            }
            let n = execute(client, &downward_sql(plan, d, round, remaining, seed)).await?;
            added_by_rule[i] += n;
            if n > 0 {
                grew.insert(plan.relationships[d.relationship].child.clone());
            }
        }
        if grew.is_empty() {
            break;
        }
        if round >= plan.max_rounds {
            return Err(unclosed(plan, &grew));
        }
        round += 1;
    }
    let mut report = ClosureReport {
        rounds: round - 1,
        kept: BTreeMap::new(),
    };
    for (i, t) in plan.tables.iter().enumerate() {
        let row = client
            .query_one(&format!("SELECT count(*) FROM {}", kept(i)), &[])
            .await
            .map_err(|e| anyhow!("counting the subset's rows of {t}: {e}"))?;
        report.kept.insert(t.clone(), row.get::<_, i64>(0) as u64);
    }
    Ok(report)
}

/// The error of a closure still growing after `maxRounds`, naming a cycle among the tables
/// that grew (or those tables, when no followed cycle joins them).
fn unclosed(plan: &ClosurePlan, grew: &BTreeSet<TableId>) -> anyhow::Error {
    let names: Vec<String> = grew.iter().map(ToString::to_string).collect();
    let edges: Vec<&Relationship> = plan
        .upward
        .iter()
        .map(|i| &plan.relationships[*i])
        .chain(
            plan.downward
                .iter()
                .map(|d| &plan.relationships[d.relationship]),
        )
        .collect();
    let cycle = grew.iter().find_map(|t| find_cycle(t, &edges));
    let through = match cycle {
        Some(c) => format!(", through the cycle {}", c.join(" → ")),
        None => String::new(),
    };
    failure::tag(
        Reason::InvalidConfig,
        anyhow!(
            "the subset's closure did not close within {} rounds (maxRounds): rows were still \
             being added to {}{through}; raise maxRounds, or cut the cycle (a `limit` on a \
             downward rule, nullableForeignKeys: set-null)",
            plan.max_rounds,
            names.join(", ")
        ),
    )
}

/// A cycle from `start` back to it along `edges` (either direction as followed), as
/// `table (foreign key)` steps.
fn find_cycle(start: &TableId, edges: &[&Relationship]) -> Option<Vec<String>> {
    let mut stack: Vec<(TableId, Vec<String>)> = vec![(start.clone(), vec![start.to_string()])];
    let mut seen = BTreeSet::new();
    while let Some((at, path)) = stack.pop() {
        for e in edges.iter().filter(|e| e.child == at) {
            let step = format!("{} ({})", e.parent, e.name);
            if &e.parent == start {
                let mut done = path.clone();
                done.push(step);
                return Some(done);
            }
            if seen.insert(e.parent.clone()) {
                let mut next = path.clone();
                next.push(step);
                stack.push((e.parent.clone(), next));
            }
        }
    }
    None
}

/// The COPY of each table's kept rows, its columns in `columns`' order; a `set-null` foreign
/// key whose parent row is not kept goes out as NULL.
pub fn copy_queries(
    plan: &ClosurePlan,
    columns: &BTreeMap<TableId, Vec<String>>,
) -> BTreeMap<TableId, String> {
    let mut out = BTreeMap::new();
    for (i, t) in plan.tables.iter().enumerate() {
        let Some(cols) = columns.get(t) else {
            continue;
        };
        let select: Vec<String> = cols
            .iter()
            .map(|c| {
                let keeps = set_null_conditions(plan, t, c);
                if keeps.is_empty() {
                    format!("t.{}", ident(c))
                } else {
                    format!("CASE WHEN {} THEN t.{} END", keeps.join(" AND "), ident(c))
                }
            })
            .collect();
        out.insert(
            t.clone(),
            format!(
                "COPY (SELECT {} FROM {} t WHERE (t.tableoid, t.ctid) IN (SELECT row_rel, row_id FROM {})) \
                 TO STDOUT",
                select.join(", "),
                qualified(t),
                kept(i)
            ),
        );
    }
    out
}

/// When column `column` of `table` keeps its value: the parent of each `set-null` foreign
/// key it is part of is kept.
fn set_null_conditions(plan: &ClosurePlan, table: &TableId, column: &str) -> Vec<String> {
    plan.set_null
        .iter()
        .map(|i| &plan.relationships[*i])
        .filter(|r| &r.child == table && r.child_columns.iter().any(|c| c == column))
        .map(|r| {
            if !plan.tables.contains(&r.parent) {
                return "false".to_string();
            }
            let on: Vec<String> = r
                .parent_columns
                .iter()
                .zip(&r.child_columns)
                .map(|(p, c)| format!("p.{} = t.{}", ident(p), ident(c)))
                .collect();
            format!(
                "EXISTS (SELECT 1 FROM {} k JOIN {} p ON p.tableoid = k.row_rel AND p.ctid = k.row_id \
                 WHERE {})",
                kept(plan.index(&r.parent)),
                qualified(&r.parent),
                on.join(" AND ")
            )
        })
        .collect()
}

/// `tables` in groups, parents before children along the `upward` relationships; the
/// tables of a cycle form one group (Tarjan's strongly connected components, which come out
/// children first).
pub fn parents_first(
    tables: &BTreeSet<TableId>,
    relationships: &[Relationship],
    upward: &[usize],
) -> Vec<Vec<TableId>> {
    let ids: Vec<&TableId> = tables.iter().collect();
    let at = |t: &TableId| ids.iter().position(|x| *x == t);
    let mut children_of: Vec<Vec<usize>> = vec![Vec::new(); ids.len()];
    for r in upward.iter().map(|i| &relationships[*i]) {
        if let (Some(c), Some(p)) = (at(&r.child), at(&r.parent)) {
            // Edge parent → child: a parent's group comes out after its children's.
            children_of[p].push(c);
        }
    }
    let mut groups = tarjan(&children_of);
    groups.reverse();
    groups
        .into_iter()
        .map(|g| {
            let mut g: Vec<TableId> = g.into_iter().map(|i| ids[i].clone()).collect();
            g.sort();
            g
        })
        .collect()
}

/// Strongly connected components of `edges` (adjacency lists), each after every component
/// it reaches.
fn tarjan(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        edges: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in &s.edges[v] {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(i) if s.on_stack[w] => s.low[v] = s.low[v].min(i),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut group = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                group.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(group);
        }
    }
    let n = edges.len();
    let mut s = State {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(child: &str, parent: &str) -> Relationship {
        Relationship {
            name: format!("{child}_{parent}_fkey"),
            child: TableId::new("public", child),
            child_columns: vec!["x".into()],
            child_exprs: vec!["\"x\"".into()],
            parent: TableId::new("public", parent),
            parent_columns: vec!["id".into()],
            nullable: false,
            deferrable: false,
            is_virtual: false,
        }
    }

    #[test]
    fn tables_come_parents_first_and_a_cycle_is_one_group() {
        let rels = vec![
            rel("rental", "customer"),
            rel("customer", "store"),
            rel("store", "staff"),
            rel("staff", "store"),
            rel("staff", "staff"),
        ];
        let tables: BTreeSet<TableId> = ["rental", "customer", "store", "staff"]
            .iter()
            .map(|t| TableId::new("public", *t))
            .collect();
        let groups = parents_first(&tables, &rels, &[0, 1, 2, 3, 4]);
        let names: Vec<Vec<String>> = groups
            .iter()
            .map(|g| g.iter().map(|t| t.table.clone()).collect())
            .collect();
        assert_eq!(
            names,
            vec![
                vec!["staff".to_string(), "store".to_string()],
                vec!["customer".to_string()],
                vec!["rental".to_string()]
            ]
        );
        let edges: Vec<&Relationship> = rels.iter().collect();
        let cycle = find_cycle(&TableId::new("public", "store"), &edges).unwrap();
        assert_eq!(
            cycle,
            vec![
                "public.store".to_string(),
                "public.staff (store_staff_fkey)".to_string(),
                "public.store (staff_store_fkey)".to_string()
            ]
        );
        assert_eq!(find_cycle(&TableId::new("public", "rental"), &edges), None);
    }
}
