//! The archive's data model: tables, change actions, changes, column definitions.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::value::Row;

/// `schema.table`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TableId {
    pub schema: String,
    pub table: String,
}

impl TableId {
    pub fn new(schema: impl Into<String>, table: impl Into<String>) -> TableId {
        TableId {
            schema: schema.into(),
            table: table.into(),
        }
    }

    /// Whether `part` can be a schema or table name of an archive: `<schema>.<table>/` is its
    /// key prefix, so neither `/` nor `..` (nor nothing) may be in it.
    pub fn is_valid_part(part: &str) -> bool {
        !part.is_empty() && !part.contains('/') && !part.contains("..")
    }
}

impl fmt::Display for TableId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.table)
    }
}

impl FromStr for TableId {
    type Err = String;
    fn from_str(s: &str) -> Result<TableId, String> {
        match s.split_once('.') {
            Some((schema, table)) if !schema.is_empty() && !table.is_empty() => {
                Ok(TableId::new(schema, table))
            }
            _ => Err(format!("table id {s:?} must be schema.table")),
        }
    }
}

/// Some of a table's columns, named by what is in or out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColumnSelection {
    /// Every column.
    All,
    /// Only these.
    Only(std::collections::BTreeSet<String>),
    /// Every column but these.
    AllBut(std::collections::BTreeSet<String>),
}

impl ColumnSelection {
    pub fn contains(&self, column: &str) -> bool {
        match self {
            ColumnSelection::All => true,
            ColumnSelection::Only(c) => c.contains(column),
            ColumnSelection::AllBut(c) => !c.contains(column),
        }
    }
}

/// A change action; its wire name is the uppercase word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Insert,
    Update,
    Delete,
    Truncate,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Insert => "INSERT",
            Action::Update => "UPDATE",
            Action::Delete => "DELETE",
            Action::Truncate => "TRUNCATE",
        }
    }

    /// Parses a wire name (case-insensitive, as laredo's reader).
    pub fn parse(s: &str) -> Option<Action> {
        match s.to_ascii_uppercase().as_str() {
            "INSERT" => Some(Action::Insert),
            "UPDATE" => Some(Action::Update),
            "DELETE" => Some(Action::Delete),
            "TRUNCATE" => Some(Action::Truncate),
            _ => None,
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One archived change record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub action: Action,
    /// laredo's RowKey string (W2); larch derives identity from the row values (R4).
    pub key: String,
    pub old: Option<Row>,
    pub new: Option<Row>,
}

/// A manifest `columns[]` entry, serialised with laredo's PascalCase names, every laredo field
/// present. `SqlType` is larch's additive field (laredo ignores it): the full SQL type with its
/// modifier, as `format_type` prints it (`numeric(12,2)`), written only when known.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
pub struct ColumnDefinition {
    pub name: String,
    #[serde(rename = "Type")]
    pub type_name: String,
    pub nullable: bool,
    pub primary_key: bool,
    pub ordinal_position: i64,
    pub primary_key_ordinal: i64,
    pub default_value: Option<String>,
    pub max_length: i64,
    #[serde(rename = "TypeOID")]
    pub type_oid: u32,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub sql_type: String,
}

/// Key fields by rule R4: configured, else the primary-key columns by ordinal, else `id`.
pub fn effective_key_fields(configured: &[String], columns: &[ColumnDefinition]) -> Vec<String> {
    if !configured.is_empty() {
        return configured.to_vec();
    }
    let mut pk: Vec<&ColumnDefinition> = columns.iter().filter(|c| c.primary_key).collect();
    if !pk.is_empty() {
        pk.sort_by_key(|c| {
            if c.primary_key_ordinal > 0 {
                c.primary_key_ordinal
            } else {
                i64::MAX
            }
        });
        return pk.into_iter().map(|c| c.name.clone()).collect();
    }
    vec!["id".to_string()]
}

/// Checks configured key fields against the archive's columns: a field that is no column is an
/// error (every row would lack it, and rows would be told apart by their whole text instead);
/// fields other than the primary key are allowed, with a warning (rows with equal values in
/// them collapse into one). Returns that warning. Without recorded columns nothing is checked.
pub fn check_key_fields(
    configured: &[String],
    columns: &[ColumnDefinition],
) -> Result<Option<String>, String> {
    if configured.is_empty() || columns.is_empty() {
        return Ok(None);
    }
    let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
    if let Some(unknown) = configured.iter().find(|k| !names.contains(&k.as_str())) {
        return Err(format!(
            "key field {unknown:?} is not a column of the archive (columns: {})",
            names.join(", ")
        ));
    }
    let pk = effective_key_fields(&[], columns);
    if columns.iter().any(|c| c.primary_key) && pk != configured {
        return Ok(Some(format!(
            "key fields [{}] differ from the archive's primary key [{}]: rows are identified by \
             them, and rows with equal values in them become one",
            configured.join(", "),
            pk.join(", ")
        )));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configured_key_fields_are_checked_against_the_columns() {
        let col = |name: &str, pk: i64| ColumnDefinition {
            name: name.into(),
            primary_key: pk > 0,
            primary_key_ordinal: pk,
            ..Default::default()
        };
        let cols = vec![col("id", 1), col("tenant", 0)];
        let k = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(check_key_fields(&k(&["id"]), &cols), Ok(None));
        assert_eq!(check_key_fields(&k(&[]), &cols), Ok(None));
        assert_eq!(check_key_fields(&k(&["nope"]), &[]), Ok(None));
        assert_eq!(
            check_key_fields(&k(&["id", "nope"]), &cols),
            Err(r#"key field "nope" is not a column of the archive (columns: id, tenant)"#.into())
        );
        let warning = check_key_fields(&k(&["tenant"]), &cols).unwrap().unwrap();
        assert!(
            warning.contains("[tenant] differ from the archive's primary key [id]"),
            "{warning}"
        );
        // No primary key recorded: nothing to differ from.
        assert_eq!(
            check_key_fields(&k(&["tenant"]), &[col("id", 0), col("tenant", 0)]),
            Ok(None)
        );
    }

    #[test]
    fn column_definition_uses_pascal_case() {
        let c = ColumnDefinition {
            name: "id".into(),
            type_name: "int8".into(),
            primary_key: true,
            ..Default::default()
        };
        let s = serde_json::to_string(&c).unwrap();
        assert_eq!(
            s,
            r#"{"Name":"id","Type":"int8","Nullable":false,"PrimaryKey":true,"OrdinalPosition":0,"PrimaryKeyOrdinal":0,"DefaultValue":null,"MaxLength":0,"TypeOID":0}"#
        );
    }

    #[test]
    fn key_fields_from_columns() {
        let cols = vec![
            ColumnDefinition {
                name: "b".into(),
                primary_key: true,
                primary_key_ordinal: 2,
                ..Default::default()
            },
            ColumnDefinition {
                name: "a".into(),
                primary_key: true,
                primary_key_ordinal: 1,
                ..Default::default()
            },
        ];
        assert_eq!(effective_key_fields(&[], &cols), vec!["a", "b"]);
        assert_eq!(effective_key_fields(&["x".into()], &cols), vec!["x"]);
        assert_eq!(effective_key_fields(&[], &[]), vec!["id"]);
        assert_eq!(
            "public.t".parse::<TableId>().unwrap(),
            TableId::new("public", "t")
        );
        assert!("nodot".parse::<TableId>().is_err());
    }
}
