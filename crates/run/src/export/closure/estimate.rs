//! `larch subset plan`: the closure a spec spans (tables in restore order, relationships and
//! how each is followed) and the rows it would keep, estimated from `EXPLAIN` without reading
//! a row: the roots' predicates as the planner estimates them (times their sample), then
//! propagated along the relationships by the tables' average fan-out. Rough by design: the
//! export's manifest records the exact counts.

use std::collections::BTreeMap;
use std::fmt::Write;

use anyhow::anyhow;
use larch_archive::model::TableId;
use larch_postgres::qualified;
use tokio_postgres::Client;

use super::ClosurePlan;

/// The planner's estimate of the rows of `SELECT 1 FROM table [WHERE predicate]`.
async fn explain_rows(
    client: &Client,
    table: &TableId,
    predicate: Option<&str>,
) -> anyhow::Result<f64> {
    let filter = predicate
        .map(|p| format!(" WHERE ({p})"))
        .unwrap_or_default();
    let sql = format!(
        "EXPLAIN (FORMAT JSON) SELECT 1 FROM {}{filter}",
        qualified(table)
    );
    let messages = client.simple_query(&sql).await.map_err(|e| {
        anyhow!(
            "EXPLAIN of table {table}: {}",
            larch_postgres::errors::message(&e)
        )
    })?;
    let text = messages
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .unwrap_or_default();
    let plan: serde_json::Value = serde_json::from_str(&text)?;
    Ok(plan[0]["Plan"]["Plan Rows"].as_f64().unwrap_or(0.0))
}

/// Each table's estimated kept rows and its estimated total.
pub async fn estimate(
    client: &Client,
    plan: &ClosurePlan,
) -> anyhow::Result<BTreeMap<TableId, (f64, f64)>> {
    let mut total = BTreeMap::new();
    for t in &plan.tables {
        total.insert(t.clone(), explain_rows(client, t, None).await?);
    }
    let mut kept: BTreeMap<TableId, f64> = plan.tables.iter().map(|t| (t.clone(), 0.0)).collect();
    for root in &plan.roots {
        let rows = explain_rows(client, &root.table, root.row_filter.as_deref()).await?;
        let share = root.sample.as_ref().map_or(1.0, |s| s.percent / 100.0);
        *kept
            .get_mut(&root.table)
            .expect("a root is a table of the plan") += rows * share;
    }
    // A few passes: enough for the estimate to settle on acyclic paths; cycles stay capped
    // by the tables' totals.
    for _ in 0..plan.tables.len().min(16) {
        for &u in &plan.upward {
            let r = &plan.relationships[u];
            let wanted = kept[&r.child].min(total[&r.parent]);
            let parent = kept.get_mut(&r.parent).expect("planned");
            *parent = parent.max(wanted);
        }
        for d in &plan.downward {
            let r = &plan.relationships[d.relationship];
            let fan_out = total[&r.child] / total[&r.parent].max(1.0);
            let share = d.sample.as_ref().map_or(1.0, |s| s.percent / 100.0);
            let mut added = kept[&r.parent] * fan_out * share;
            if let Some(limit) = d.limit {
                added = added.min(limit as f64);
            }
            let child = kept.get_mut(&r.child).expect("planned");
            *child = child.max(added).min(total[&r.child]);
        }
    }
    Ok(plan
        .tables
        .iter()
        .map(|t| (t.clone(), (kept[t].round(), total[t].round())))
        .collect())
}

/// The plan as `larch subset plan` prints it.
pub fn plan_text(plan: &ClosurePlan, estimates: &BTreeMap<TableId, (f64, f64)>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "tables (parents first: the order a restore loads them):"
    );
    for t in &plan.tables {
        let (kept, total) = estimates.get(t).copied().unwrap_or_default();
        let root = if plan.roots.iter().any(|r| &r.table == t) {
            " (root)"
        } else {
            ""
        };
        let _ = writeln!(out, "  {t}{root}: ~{kept} of ~{total} rows");
    }
    let _ = writeln!(out, "relationships:");
    for (i, r) in plan.relationships.iter().enumerate() {
        let mut how = Vec::new();
        if plan.upward.contains(&i) {
            how.push("upward".to_string());
        }
        if plan.set_null.contains(&i) {
            how.push("set-null".to_string());
        }
        for d in plan.downward.iter().filter(|d| d.relationship == i) {
            let mut down = "downward".to_string();
            if let Some(l) = d.limit {
                let _ = write!(down, " (limit {l})");
            }
            if let Some(s) = &d.sample {
                let _ = write!(down, " (sample {}%)", s.percent);
            }
            how.push(down);
        }
        let kind = if r.is_virtual {
            "virtual"
        } else {
            "constraint"
        };
        let _ = writeln!(
            out,
            "  {} [{kind} {}]: {}",
            r.describe(),
            r.name,
            how.join(", ")
        );
    }
    let _ = writeln!(out, "at most {} rounds (maxRounds)", plan.max_rounds);
    out
}
