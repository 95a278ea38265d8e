//! A restore that creates a partitioned table recreates its partitions, as the manifest's
//! `partitioning` records them (checked first: [`larch_archive::partitioning::check`]), so
//! rows go to the partitions they came from.

use larch_archive::model::{ColumnDefinition, TableId};
use larch_archive::partitioning::PartitioningRecord;

use crate::engine::targets::postgres::{create_unkeyed_table_sql, quote_ident};

/// The statements that create `table` partitioned by `record`, then every partition (parents
/// before their own partitions), one statement each.
pub fn create_statements(
    table: &TableId,
    columns: &[ColumnDefinition],
    key_fields: &[String],
    record: &PartitioningRecord,
) -> Vec<String> {
    let mut out = vec![format!(
        "{} PARTITION BY {}",
        create_unkeyed_table_sql(table, columns, key_fields),
        record.key
    )];
    partitions_of(&qualified(&table.schema, &table.table), record, &mut out);
    out
}

fn partitions_of(parent: &str, record: &PartitioningRecord, out: &mut Vec<String>) {
    for p in &record.partitions {
        let name = qualified(&p.schema, &p.name);
        let sub = p
            .partitioning
            .as_ref()
            .map(|s| format!(" PARTITION BY {}", s.key))
            .unwrap_or_default();
        out.push(format!(
            "CREATE TABLE {name} PARTITION OF {parent} {}{sub}",
            p.bound
        ));
        if let Some(s) = &p.partitioning {
            partitions_of(&name, s, out);
        }
    }
}

fn qualified(schema: &str, name: &str) -> String {
    format!("{}.{}", quote_ident(schema), quote_ident(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use larch_archive::partitioning::PartitionRecord;

    #[test]
    fn parents_come_before_their_partitions() {
        let record = PartitioningRecord {
            key: "RANGE (at)".into(),
            partitions: vec![PartitionRecord {
                schema: "public".into(),
                name: "ev 2025".into(),
                bound: "FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')".into(),
                partitioning: Some(Box::new(PartitioningRecord {
                    key: "LIST (region)".into(),
                    partitions: vec![PartitionRecord {
                        schema: "public".into(),
                        name: "ev_2025_eu".into(),
                        bound: "FOR VALUES IN ('eu')".into(),
                        partitioning: None,
                    }],
                })),
            }],
        };
        let table = TableId::new("public", "ev");
        let got = create_statements(&table, &[], &[], &record);
        assert_eq!(got.len(), 3);
        assert!(got[0].ends_with(") PARTITION BY RANGE (at)"), "{}", got[0]);
        assert_eq!(
            got[1],
            "CREATE TABLE \"public\".\"ev 2025\" PARTITION OF \"public\".\"ev\" FOR VALUES \
             FROM ('2025-01-01') TO ('2026-01-01') PARTITION BY LIST (region)"
        );
        assert_eq!(
            got[2],
            "CREATE TABLE \"public\".\"ev_2025_eu\" PARTITION OF \"public\".\"ev 2025\" \
             FOR VALUES IN ('eu')"
        );
    }
}
