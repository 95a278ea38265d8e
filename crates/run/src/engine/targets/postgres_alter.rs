//! Keeping the PostgreSQL target's table in the archive's shape: after a schema change upstream
//! the archive starts a new epoch with other columns, and the baseline that follows alters the
//! destination table to match inside its own transaction (after its `TRUNCATE`, so every
//! statement runs on an empty table), so readers see the old table with the old rows or the
//! new table with the new rows (C2).

use anyhow::Context;
use tokio_postgres::Client;

use super::postgres_sql::{quote_ident, sql_type};
use larch_archive::model::{ColumnDefinition, TableId};

/// The destination table as it is.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TableShape {
    /// (name, udt name, NOT NULL) in attnum order.
    pub columns: Vec<(String, String, bool)>,
    /// The primary key constraint's name and columns in key order.
    pub primary_key: Option<(String, Vec<String>)>,
    /// Columns of the other unique indexes (any one of them can serve `ON CONFLICT`).
    pub unique: Vec<Vec<String>>,
}

pub async fn read_shape(client: &Client, table: &str) -> anyhow::Result<TableShape> {
    let columns = client
        .query(
            "SELECT a.attname::text, t.typname::text, a.attnotnull FROM pg_attribute a \
             JOIN pg_type t ON t.oid = a.atttypid \
             WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped \
             ORDER BY a.attnum",
            &[&table],
        )
        .await
        .with_context(|| format!("postgres target: reading the columns of {table}"))?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let mut shape = TableShape {
        columns,
        ..Default::default()
    };
    let indexes = client
        .query(
            "SELECT i.indisprimary, c.conname::text,
                    array(SELECT a.attname::text FROM unnest(i.indkey) WITH ORDINALITY k(attnum, ord)
                            JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                           ORDER BY k.ord)
               FROM pg_index i LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.contype = 'p'
              WHERE i.indrelid = $1::text::regclass AND i.indisunique AND i.indpred IS NULL
                AND i.indexprs IS NULL",
            &[&table],
        )
        .await
        .with_context(|| format!("postgres target: reading the keys of {table}"))?;
    for r in indexes {
        let primary: bool = r.get(0);
        let name: Option<String> = r.get(1);
        let cols: Vec<String> = r.get(2);
        match (primary, name) {
            (true, Some(name)) => shape.primary_key = Some((name, cols)),
            _ => shape.unique.push(cols),
        }
    }
    Ok(shape)
}

/// The udt name of a column `create_table_sql` makes for a laredo `Type`.
fn created_udt(udt: &str) -> String {
    let t = sql_type(udt);
    match t.strip_suffix("[]") {
        Some(elem) => format!("_{elem}"),
        None => t,
    }
}

/// The statements that give `table` (now `shape`, empty inside the baseline's transaction) the
/// archive's columns and key: columns the archive does not have are dropped, new ones added,
/// columns of another type retyped (a column of the archive's own type, such as an enum that
/// exists on the destination, is kept), NOT NULL dropped where the archive allows NULL, and
/// the primary key replaced when the key fields differ. Nothing when the archive's columns are
/// inferred (no types: the table is used as it is).
pub fn alter_statements(
    table: &TableId,
    shape: &TableShape,
    columns: &[ColumnDefinition],
    key_fields: &[String],
) -> Vec<String> {
    if inferred(columns) {
        return Vec::new();
    }
    let alter = |what: String| alter_table(table, &what);
    let mut out = Vec::new();
    let key_ok = match &shape.primary_key {
        Some((_, pk)) => pk == key_fields,
        None => shape.unique.iter().any(|u| u == key_fields),
    };
    if !key_ok && let Some((name, _)) = &shape.primary_key {
        out.push(alter(format!("DROP CONSTRAINT {}", quote_ident(name))));
    }
    out.extend(column_statements(table, shape, columns, key_fields));
    if !key_ok {
        let keys: Vec<String> = key_fields.iter().map(|k| quote_ident(k)).collect();
        out.push(alter(format!("ADD PRIMARY KEY ({})", keys.join(", "))));
    }
    out
}

/// Columns without types (an inferred schema): the table is used as it is.
fn inferred(columns: &[ColumnDefinition]) -> bool {
    columns.iter().all(|c| c.type_name.is_empty())
}

fn alter_table(table: &TableId, what: &str) -> String {
    format!(
        "ALTER TABLE {}.{} {what}",
        quote_ident(&table.schema),
        quote_ident(&table.table)
    )
}

/// The column part of [`alter_statements`] (no key changes): what a baseline's staging table,
/// created like the destination table without its keys, needs to get the archive's columns.
pub fn column_statements(
    table: &TableId,
    shape: &TableShape,
    columns: &[ColumnDefinition],
    key_fields: &[String],
) -> Vec<String> {
    if inferred(columns) {
        return Vec::new();
    }
    let alter = |what: String| alter_table(table, &what);
    let mut out = Vec::new();
    for (name, _, _) in &shape.columns {
        if !columns.iter().any(|c| &c.name == name) {
            out.push(alter(format!("DROP COLUMN {}", quote_ident(name))));
        }
    }
    let mut archive: Vec<&ColumnDefinition> = columns.iter().collect();
    archive.sort_by_key(|c| c.ordinal_position);
    for c in archive {
        let col = quote_ident(&c.name);
        match shape.columns.iter().find(|(n, _, _)| n == &c.name) {
            None => out.push(alter(format!(
                "ADD COLUMN {col} {}",
                sql_type(&c.type_name)
            ))),
            Some((_, udt, not_null)) => {
                if !c.type_name.is_empty()
                    && *udt != c.type_name
                    && *udt != created_udt(&c.type_name)
                {
                    out.push(alter(format!(
                        "ALTER COLUMN {col} TYPE {} USING NULL",
                        sql_type(&c.type_name)
                    )));
                }
                if *not_null && c.nullable && !key_fields.contains(&c.name) {
                    out.push(alter(format!("ALTER COLUMN {col} DROP NOT NULL")));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, udt: &str, nullable: bool, ord: i64) -> ColumnDefinition {
        ColumnDefinition {
            name: name.into(),
            type_name: udt.into(),
            nullable,
            ordinal_position: ord,
            ..Default::default()
        }
    }

    fn shape(cols: &[(&str, &str, bool)], pk: &[&str]) -> TableShape {
        TableShape {
            columns: cols
                .iter()
                .map(|(n, t, nn)| (n.to_string(), t.to_string(), *nn))
                .collect(),
            primary_key: Some((
                "items_pkey".into(),
                pk.iter().map(|s| s.to_string()).collect(),
            )),
            unique: vec![],
        }
    }

    #[test]
    fn the_table_follows_the_archive() {
        let t = TableId::new("public", "items");
        let keys = vec!["id".to_string()];
        let now = shape(
            &[
                ("id", "int8", true),
                ("name", "text", true),
                ("qty", "int4", false),
                ("tags", "_text", false),
                ("mood", "mood", false),
            ],
            &["id"],
        );
        let same = vec![
            col("id", "int8", false, 1),
            col("name", "text", false, 2),
            col("qty", "int4", true, 3),
            col("tags", "_text", true, 4),
            // An enum the destination has: kept; created by larch it would be text.
            col("mood", "mood", true, 5),
        ];
        assert!(alter_statements(&t, &now, &same, &keys).is_empty());
        let mut as_text = now.clone();
        as_text.columns[4].1 = "text".into();
        assert!(alter_statements(&t, &as_text, &same, &keys).is_empty());

        // Renamed, retyped, added, NOT NULL dropped, a new key.
        let changed = vec![
            col("id", "int8", false, 1),
            col("title", "text", false, 6),
            col("qty", "numeric", true, 3),
            col("tags", "_text", true, 4),
            col("mood", "mood", true, 5),
            col("name", "text", true, 2),
        ];
        let new_keys = vec!["id".to_string(), "title".to_string()];
        assert_eq!(
            alter_statements(&t, &now, &changed, &new_keys),
            vec![
                r#"ALTER TABLE "public"."items" DROP CONSTRAINT "items_pkey""#,
                r#"ALTER TABLE "public"."items" ALTER COLUMN "name" DROP NOT NULL"#,
                r#"ALTER TABLE "public"."items" ALTER COLUMN "qty" TYPE numeric USING NULL"#,
                r#"ALTER TABLE "public"."items" ADD COLUMN "title" text"#,
                r#"ALTER TABLE "public"."items" ADD PRIMARY KEY ("id", "title")"#,
            ]
        );
        let dropped: Vec<ColumnDefinition> = same[..3].to_vec();
        assert_eq!(
            alter_statements(&t, &now, &dropped, &keys),
            vec![
                r#"ALTER TABLE "public"."items" DROP COLUMN "tags""#,
                r#"ALTER TABLE "public"."items" DROP COLUMN "mood""#,
            ]
        );
        // A unique index on the key fields serves as well as a primary key.
        let mut unique = now.clone();
        unique.primary_key = None;
        unique.unique = vec![vec!["id".into()]];
        assert!(alter_statements(&t, &unique, &same, &keys).is_empty());
        // Inferred columns (no types): the table is used as it is.
        let inferred = vec![col("id", "", true, 1), col("other", "", true, 2)];
        assert!(alter_statements(&t, &now, &inferred, &keys).is_empty());
    }
}
