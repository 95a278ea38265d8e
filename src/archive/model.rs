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

#[cfg(test)]
mod tests {
    use super::*;

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
