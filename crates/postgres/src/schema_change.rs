//! Schema changes of a followed table: how the table's columns now differ from the columns its
//! archive was written with, and whether that difference changes archived rows.
//!
//! A **shape** change (a column added, dropped, renamed, dropped and added again, a new type or
//! type modifier, other key fields, a column that may now be NULL) changes rows PostgreSQL sends
//! no change for (`ADD COLUMN … DEFAULT 7` rewrites nothing in WAL), so the archive needs a new
//! epoch from a fresh snapshot. A **metadata** change (a default, `SET NOT NULL`, primary-key
//! flags under configured key fields) changes no row: the new columns are just recorded.

use super::pgoutput::Relation;
use super::schema::TableSchema;
use larch_archive::model::ColumnDefinition;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchemaChange {
    None,
    Metadata,
    /// What changed, for logs and status (`column extra added; key (id) → (id, name)`).
    Shape(String),
}

/// Compares the columns an archive was written with (`recorded`, with the key fields it uses)
/// against the table's columns now. Columns recorded without `SqlType` (an older larch) are
/// compared by name, type and nullability only.
pub fn classify(
    recorded: &[ColumnDefinition],
    recorded_keys: &[String],
    current: &[ColumnDefinition],
    current_keys: &[String],
) -> SchemaChange {
    let mut what = Vec::new();
    for c in current {
        let Some(r) = recorded.iter().find(|r| r.name == c.name) else {
            what.push(format!("column {} added", c.name));
            continue;
        };
        let exact = !r.sql_type.is_empty() && !c.sql_type.is_empty();
        if r.type_name != c.type_name || (exact && r.sql_type != c.sql_type) {
            let (from, to) = if exact {
                (&r.sql_type, &c.sql_type)
            } else {
                (&r.type_name, &c.type_name)
            };
            what.push(format!("column {} type {from} → {to}", c.name));
        } else if exact && r.ordinal_position != c.ordinal_position {
            what.push(format!("column {} dropped and added again", c.name));
        }
        if c.nullable && !r.nullable {
            what.push(format!("column {} may be NULL now", c.name));
        }
    }
    for r in recorded {
        if !current.iter().any(|c| c.name == r.name) {
            what.push(format!("column {} dropped", r.name));
        }
    }
    if recorded_keys != current_keys {
        what.push(format!(
            "key ({}) → ({})",
            recorded_keys.join(", "),
            current_keys.join(", ")
        ));
    }
    if !what.is_empty() {
        return SchemaChange::Shape(what.join("; "));
    }
    if recorded == current {
        SchemaChange::None
    } else {
        SchemaChange::Metadata
    }
}

/// Compares a pgoutput Relation message with the schema being archived: a different column
/// list, type or type modifier is a shape change (the message describes the rows that follow).
pub fn relation_differs(rel: &Relation, schema: &TableSchema) -> Option<String> {
    let names: Vec<&str> = rel.columns.iter().map(|c| c.name.as_str()).collect();
    let sent: Vec<usize> = (0..schema.columns.len())
        .filter(|&i| !schema.generated.get(i).copied().unwrap_or(false))
        .collect();
    let recorded: Vec<&str> = sent
        .iter()
        .map(|&i| schema.columns[i].name.as_str())
        .collect();
    if names != recorded {
        return Some(format!(
            "the replication stream's columns ({}) differ from the archived ones ({})",
            names.join(", "),
            recorded.join(", ")
        ));
    }
    for (c, &i) in rel.columns.iter().zip(&sent) {
        if schema.type_oids.get(i) != Some(&c.type_oid)
            || schema.type_mods.get(i) != Some(&c.type_mod)
        {
            return Some(format!(
                "the replication stream's column {} has another type than the archived {}",
                c.name,
                schema.sql_types.get(i).map(String::as_str).unwrap_or("?")
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pgoutput::RelationColumn;
    use larch_archive::model::TableId;

    fn col(name: &str, sql_type: &str, attnum: i64) -> ColumnDefinition {
        ColumnDefinition {
            name: name.into(),
            type_name: sql_type.split('(').next().unwrap().into(),
            sql_type: sql_type.into(),
            ordinal_position: attnum,
            nullable: true,
            ..Default::default()
        }
    }

    fn keys(k: &[&str]) -> Vec<String> {
        k.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn shape_changes_are_told_apart_from_metadata() {
        let id = ColumnDefinition {
            nullable: false,
            primary_key: true,
            primary_key_ordinal: 1,
            ..col("id", "int8", 1)
        };
        let base = vec![id.clone(), col("name", "text", 2), col("qty", "int4", 3)];
        let k = keys(&["id"]);
        assert_eq!(classify(&base, &k, &base, &k), SchemaChange::None);

        let mut added = base.clone();
        added.push(col("extra", "int4", 4));
        assert_eq!(
            classify(&base, &k, &added, &k),
            SchemaChange::Shape("column extra added".into())
        );
        assert_eq!(
            classify(&added, &k, &base, &k),
            SchemaChange::Shape("column extra dropped".into())
        );
        let renamed = vec![id.clone(), col("title", "text", 2), col("qty", "int4", 3)];
        assert_eq!(
            classify(&base, &k, &renamed, &k),
            SchemaChange::Shape("column title added; column name dropped".into())
        );
        let retyped = vec![
            id.clone(),
            col("name", "text", 2),
            col("qty", "numeric(12,2)", 3),
        ];
        assert_eq!(
            classify(&base, &k, &retyped, &k),
            SchemaChange::Shape("column qty type int4 → numeric(12,2)".into())
        );
        // Same udt, another modifier: the values' text changes (scale, precision, padding).
        let scaled = vec![
            id.clone(),
            col("name", "text", 2),
            col("qty", "numeric(12,4)", 3),
        ];
        assert_eq!(
            classify(&retyped, &k, &scaled, &k),
            SchemaChange::Shape("column qty type numeric(12,2) → numeric(12,4)".into())
        );
        // Dropped and added again under the same name and type: a new attnum, new values.
        let readded = vec![id.clone(), col("name", "text", 2), col("qty", "int4", 4)];
        assert_eq!(
            classify(&base, &k, &readded, &k),
            SchemaChange::Shape("column qty dropped and added again".into())
        );
        let rekeyed = keys(&["id", "name"]);
        assert_eq!(
            classify(&base, &k, &base, &rekeyed),
            SchemaChange::Shape("key (id) → (id, name)".into())
        );

        // A default, or NOT NULL added: no row changes.
        let mut defaulted = base.clone();
        defaulted[2].default_value = Some("7".into());
        assert_eq!(classify(&base, &k, &defaulted, &k), SchemaChange::Metadata);
        let mut strict = base.clone();
        strict[1].nullable = false;
        assert_eq!(classify(&base, &k, &strict, &k), SchemaChange::Metadata);
        // NOT NULL dropped: followers that mirror NOT NULL must learn it.
        assert_eq!(
            classify(&strict, &k, &base, &k),
            SchemaChange::Shape("column name may be NULL now".into())
        );

        // Columns an older larch recorded (no SqlType, dense ordinals): names and types only.
        let old: Vec<ColumnDefinition> = base
            .iter()
            .enumerate()
            .map(|(i, c)| ColumnDefinition {
                sql_type: String::new(),
                ordinal_position: i as i64 + 1,
                ..c.clone()
            })
            .collect();
        assert_eq!(classify(&old, &k, &readded, &k), SchemaChange::Metadata);
        assert_eq!(
            classify(&old, &k, &retyped, &k),
            SchemaChange::Shape("column qty type int4 → numeric".into())
        );
    }

    #[test]
    fn a_relation_message_is_compared_column_by_column() {
        let schema = TableSchema {
            id: TableId::new("public", "t"),
            columns: vec![col("id", "int8", 1), col("amount", "numeric(12,2)", 2)],
            type_oids: vec![20, 1700],
            type_mods: vec![-1, (12 << 16 | 2) + 4],
            sql_types: vec!["bigint".into(), "numeric(12,2)".into()],
            generated: vec![false, false],
            key_fields: keys(&["id"]),
            has_primary_key: true,
            replica_identity: 'd',
        };
        let rel = |cols: &[(&str, u32, i32)]| Relation {
            oid: 1,
            namespace: "public".into(),
            name: "t".into(),
            replica_identity: b'd',
            columns: cols
                .iter()
                .map(|(n, oid, m)| RelationColumn {
                    key: *n == "id",
                    name: n.to_string(),
                    type_oid: *oid,
                    type_mod: *m,
                })
                .collect(),
        };
        let same = rel(&[("id", 20, -1), ("amount", 1700, (12 << 16 | 2) + 4)]);
        assert_eq!(relation_differs(&same, &schema), None);
        let added = rel(&[
            ("id", 20, -1),
            ("amount", 1700, (12 << 16 | 2) + 4),
            ("extra", 23, -1),
        ]);
        assert!(
            relation_differs(&added, &schema)
                .unwrap()
                .contains("(id, amount, extra) differ from the archived ones (id, amount)")
        );
        let rescaled = rel(&[("id", 20, -1), ("amount", 1700, (12 << 16 | 4) + 4)]);
        assert!(
            relation_differs(&rescaled, &schema)
                .unwrap()
                .contains("column amount has another type than the archived numeric(12,2)")
        );
    }
}
