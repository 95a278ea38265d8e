//! What the ArchiveExport schema and its CEL rules cannot say (see [`crate::reconcile::validate`]).

use crate::crd::archive_export::ArchiveExport;
use crate::crd::common::TableRef;
use crate::reconcile::validate::{affinity, key_fields, key_prefix, tables};
use larch_archive::model::TableId;

/// What the tables' `where:` subqueries may read, as the exporter allows it: with
/// `spec.transform.subqueries`, the export's tables, each with the columns it exports unmasked.
fn subquery_tables(
    tables: &[TableRef],
    transform: &crate::crd::archive_export::ExportTransform,
) -> Option<larch_postgres::SubqueryTables> {
    let rules = transform.subqueries.then(|| transform.rules())?;
    let ids = tables.iter().map(|t| TableId::new(t.schema(), &t.name));
    let readable = ids.map(|id| {
        let columns = rules.unmasked_columns(&id);
        (id, columns)
    });
    Some(readable.collect())
}

/// What an ArchiveExport's spec says that cannot work; the message names the field.
pub fn export(export: &ArchiveExport) -> Result<(), String> {
    let spec = &export.spec;
    affinity(spec.pod.as_ref())?;
    let all = spec.source.all_tables();
    if all.is_empty() {
        return Err("set spec.source.table or spec.source.tables".into());
    }
    let field = if spec.source.tables.is_some() {
        "spec.source.tables"
    } else {
        "spec.source.table"
    };
    tables(field, &all)?;
    key_fields("spec.source.keyFields", spec.source.key_fields.as_ref())?;
    key_prefix("spec.keyPrefix", spec.key_prefix.as_deref())?;
    if let Some(t) = &spec.transform {
        let subqueries = subquery_tables(&all, t);
        for (name, rules) in &t.tables {
            let Some(predicate) = &rules.row_filter else {
                continue;
            };
            let field = format!("spec.transform.tables[{name:?}].where");
            let table: TableId = name
                .parse()
                .map_err(|_| format!("spec.transform.tables[{name:?}]: not schema.table"))?;
            larch_postgres::check_row_filter_with(&table, predicate, subqueries.as_ref())
                .map_err(|why| format!("{field} {predicate:?}: {why}"))?;
        }
    }
    if let Some(subset) = &spec.subset {
        subset.check().map_err(|e| format!("spec.subset: {e}"))?;
        for (name, root) in &subset.roots {
            let (Some(predicate), Ok(table)) = (&root.row_filter, name.parse::<TableId>()) else {
                continue;
            };
            larch_postgres::check_row_filter_with(&table, predicate, None)
                .map_err(|why| format!("spec.subset.roots[{name:?}].where {predicate:?}: {why}"))?;
        }
    }
    if let Some(s) = &spec.schedule {
        crate::cron::check_schedule(&s.cron).map_err(|e| {
            format!(
                "spec.schedule.cron {:?} is not a valid schedule: {e}",
                s.cron
            )
        })?;
    }
    Ok(())
}
