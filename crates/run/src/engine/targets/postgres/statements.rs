//! The statements the target writes changes and checkpoints with, built from the table's
//! actual columns: rows arrive as a JSON array, turned into the table's row type by
//! `jsonb_populate_record` (bytea columns decoded from base64 on their own).

use larch_archive::model::TableId;

use super::{qualified, quote_ident, table_identity_sql};

#[derive(Clone, Debug)]
pub(super) struct Statements {
    pub(super) upsert: String,
    pub(super) delete: String,
    pub(super) truncate: String,
    pub(super) checkpoint: String,
}

impl Statements {
    /// `cols`: the table's columns (name, type name) in order; `checkpoint_table` the
    /// checkpoint table in the table's schema.
    pub(super) fn build(
        table: &TableId,
        checkpoint_table: &TableId,
        cols: &[(String, String)],
        key_fields: &[String],
    ) -> Statements {
        let tbl = qualified(table);
        let from = json_rows(&tbl, cols);
        let names: Vec<String> = cols.iter().map(|(n, _)| quote_ident(n)).collect();
        let pk: Vec<String> = key_fields.iter().map(|k| quote_ident(k)).collect();
        let updates: Vec<String> = cols
            .iter()
            .filter(|(n, _)| !key_fields.contains(n))
            .map(|(n, _)| format!("{0} = EXCLUDED.{0}", quote_ident(n)))
            .collect();
        let conflict = if updates.is_empty() {
            "DO NOTHING".to_string()
        } else {
            format!("DO UPDATE SET {}", updates.join(", "))
        };
        let upsert = format!(
            "INSERT INTO {tbl} ({}) SELECT {} {from} ON CONFLICT ({}) {conflict}",
            names.join(", "),
            select_list(cols).join(", "),
            pk.join(", ")
        );
        let pk_select: Vec<String> = key_fields
            .iter()
            .map(|k| format!("r.{}", quote_ident(k)))
            .collect();
        let delete = format!(
            "DELETE FROM {tbl} WHERE ({}) IN (SELECT {} {from})",
            pk.join(", "),
            pk_select.join(", ")
        );
        let checkpoint = format!(
            "INSERT INTO {} (target_table, source, position, table_identity, updated_at) \
             VALUES ($1, $2, $3, {}, now()) \
             ON CONFLICT (target_table) DO UPDATE SET source = EXCLUDED.source, \
             position = EXCLUDED.position, table_identity = EXCLUDED.table_identity, \
             updated_at = EXCLUDED.updated_at",
            qualified(checkpoint_table),
            table_identity_sql(4)
        );
        Statements {
            upsert,
            delete,
            truncate: format!("TRUNCATE {tbl}"),
            checkpoint,
        }
    }
}

/// The `FROM` clause reading parameter `$1` (a JSON array of rows) as rows `r` of `tbl`, with
/// bytea fields left out of the record (`e.j` keeps them for [`select_list`]).
fn json_rows(tbl: &str, cols: &[(String, String)]) -> String {
    let bytea: Vec<&str> = cols
        .iter()
        .filter(|(_, t)| t == "bytea")
        .map(|(n, _)| n.as_str())
        .collect();
    let strip = if bytea.is_empty() {
        "e.j".to_string()
    } else {
        format!(
            "e.j - ARRAY[{}]::text[]",
            bytea
                .iter()
                .map(|n| format!("'{}'", n.replace('\'', "''")))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    format!(
        "FROM jsonb_array_elements($1::text::jsonb) AS e(j), \
         LATERAL jsonb_populate_record(NULL::{tbl}, {strip}) AS r"
    )
}

/// Each column's value: from the record, bytea decoded from the JSON's base64.
fn select_list(cols: &[(String, String)]) -> Vec<String> {
    cols.iter()
        .map(|(n, t)| {
            if t == "bytea" {
                format!("decode(e.j ->> '{}', 'base64')", n.replace('\'', "''"))
            } else {
                format!("r.{}", quote_ident(n))
            }
        })
        .collect()
}
