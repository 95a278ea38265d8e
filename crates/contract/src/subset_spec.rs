//! A subset that follows foreign keys (dev seeds): one type for the CLI's file (`larch export
//! --subset FILE`, `larch subset plan`) and, later, an ArchiveExport's spec. Roots say which
//! rows start the subset; the closure keeps every row a kept row references (upward, always)
//! and, per relationship that opts in, the rows that reference kept rows (downward).
//! Computing it is the exporter's (`larch_postgres::closure`); docs/subsetting.md.

use std::collections::{BTreeMap, BTreeSet};

use larch_archive::model::TableId;
use serde::{Deserialize, Serialize};

use crate::transform_rules::SampleRule;

/// Rounds the closure may take by default before it is declared unclosed.
pub const DEFAULT_MAX_ROUNDS: u32 = 1000;

/// The subset spec: `schema.table` names throughout.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubsetSpec {
    /// Tables exported besides the roots and the tables the closure reaches (each gets the
    /// rows the closure keeps in it, possibly none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024), inner(length(max = 128)))]
    pub tables: Vec<String>,
    /// `schema.table` → which of its rows start the subset (`where:` and/or `sample:`; both:
    /// the sample of the rows the predicate keeps).
    #[schemars(extend("maxProperties" = 256))]
    pub roots: BTreeMap<String, RootRule>,
    /// Relationships followed downward: the rows of `table` that reference a kept row of
    /// `references` are kept too. Upward (a kept row's parents) is always followed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024))]
    pub downward: Vec<DownwardRule>,
    /// Relationships without a constraint, followed like foreign keys.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024))]
    pub virtual_foreign_keys: Vec<VirtualForeignKey>,
    /// What a nullable foreign key whose parent is not otherwise kept becomes.
    #[serde(default)]
    pub nullable_foreign_keys: NullablePolicy,
    /// The closure's rounds at most (default 1000): a closure still growing after them fails,
    /// naming the cycle that keeps it growing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rounds: Option<u32>,
}

/// Which rows of a root table start the subset.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RootRule {
    /// An SQL predicate on the table's columns (the rules of a `where:` in docs/masking.md).
    #[serde(default, rename = "where", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub row_filter: Option<String>,
    /// A deterministic sample by a keyed hash of a column (default: the key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<SampleRule>,
}

/// One relationship followed downward, with an optional cap and sample of the rows it adds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DownwardRule {
    /// The referencing (child) table.
    #[schemars(length(max = 128))]
    pub table: String,
    /// The referenced (parent) table.
    #[schemars(length(max = 128))]
    pub references: String,
    /// The child's foreign key columns, when several relationships join the two tables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 63)))]
    pub columns: Vec<String>,
    /// At most this many rows of `table` are added through this relationship.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Of the referencing rows, keep this sample only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<SampleRule>,
}

/// A relationship the catalog does not declare: `table`'s `columns` (or one SQL `expression`
/// on its columns, e.g. a key inside a JSON column) reference `references`'
/// `referencedColumns`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VirtualForeignKey {
    #[schemars(length(max = 128))]
    pub table: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 63)))]
    pub columns: Vec<String>,
    /// Instead of `columns`: one SQL expression on the table's columns, such as
    /// `(payload->>'customer_id')::bigint` (the rules of a `where:`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub expression: Option<String>,
    #[schemars(length(max = 128))]
    pub references: String,
    #[schemars(length(max = 32), inner(length(max = 63)))]
    pub referenced_columns: Vec<String>,
}

/// See [`SubsetSpec::nullable_foreign_keys`].
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum NullablePolicy {
    /// Keep the parent (like a NOT NULL foreign key).
    #[default]
    IncludeParent,
    /// Export the foreign key's columns as NULL when their parent is not kept.
    SetNull,
}

impl SubsetSpec {
    /// Reads a spec file (YAML or JSON); errors name the file and the field.
    pub fn load(path: &std::path::Path) -> Result<SubsetSpec, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--subset {}: {e}", path.display()))?;
        Self::parse(&text, &format!("--subset {}", path.display()))
    }

    /// Parses and checks a spec; errors start with `what`.
    pub fn parse(text: &str, what: &str) -> Result<SubsetSpec, String> {
        let spec: SubsetSpec = crate::from_yaml(text).map_err(|e| format!("{what}: {e}"))?;
        spec.check().map_err(|e| format!("{what}: {e}"))?;
        Ok(spec)
    }

    /// The checks that need no database: names parse, numbers are in range, a virtual key
    /// has columns or an expression matching its referenced columns.
    pub fn check(&self) -> Result<(), String> {
        if self.roots.is_empty() {
            return Err("roots: no root table: name at least one".into());
        }
        for (i, t) in self.tables.iter().enumerate() {
            table_id(t).map_err(|e| format!("tables[{i}]: {e}"))?;
        }
        for (name, rule) in &self.roots {
            table_id(name).map_err(|e| format!("roots.{name}: {e}"))?;
            if let Some(s) = &rule.sample {
                check_percent(s).map_err(|e| format!("roots.{name}.sample: {e}"))?;
            }
        }
        for (i, d) in self.downward.iter().enumerate() {
            let at = format!("downward[{i}]");
            table_id(&d.table).map_err(|e| format!("{at}.table: {e}"))?;
            table_id(&d.references).map_err(|e| format!("{at}.references: {e}"))?;
            if let Some(s) = &d.sample {
                check_percent(s).map_err(|e| format!("{at}.sample: {e}"))?;
            }
        }
        for (i, v) in self.virtual_foreign_keys.iter().enumerate() {
            v.check()
                .map_err(|e| format!("virtualForeignKeys[{i}]{e}"))?;
        }
        if self.max_rounds == Some(0) {
            return Err("maxRounds: must be at least 1".into());
        }
        Ok(())
    }

    /// Every table the spec names, parsed.
    pub fn named_tables(&self) -> BTreeSet<TableId> {
        let names = self
            .tables
            .iter()
            .chain(self.roots.keys())
            .chain(self.downward.iter().flat_map(|d| [&d.table, &d.references]))
            .chain(
                self.virtual_foreign_keys
                    .iter()
                    .flat_map(|v| [&v.table, &v.references]),
            );
        names.filter_map(|n| table_id(n).ok()).collect()
    }

    pub fn max_rounds(&self) -> u32 {
        self.max_rounds.unwrap_or(DEFAULT_MAX_ROUNDS)
    }
}

impl VirtualForeignKey {
    /// Errors start with the field's path below the key (`.columns: …`).
    fn check(&self) -> Result<(), String> {
        table_id(&self.table).map_err(|e| format!(".table: {e}"))?;
        table_id(&self.references).map_err(|e| format!(".references: {e}"))?;
        if self.referenced_columns.is_empty() {
            return Err(".referencedColumns: name the referenced columns".into());
        }
        match (&self.expression, self.columns.len()) {
            (Some(_), 0) if self.referenced_columns.len() == 1 => Ok(()),
            (Some(_), 0) => Err(format!(
                ".expression: an expression references one column, not {} (referencedColumns)",
                self.referenced_columns.len()
            )),
            (Some(_), _) => Err(".expression: give columns or an expression, not both".into()),
            (None, 0) => Err(".columns: give the referencing columns (or an expression)".into()),
            (None, n) if n != self.referenced_columns.len() => Err(format!(
                ".columns: {n} columns reference {} (referencedColumns): give as many",
                self.referenced_columns.len()
            )),
            (None, _) => Ok(()),
        }
    }
}

fn check_percent(s: &SampleRule) -> Result<(), String> {
    if s.percent > 0.0 && s.percent <= 100.0 {
        Ok(())
    } else {
        Err(format!("percent {} is not in (0, 100]", s.percent))
    }
}

/// `schema.table` (both parts required, as in the transform rules).
pub fn table_id(name: &str) -> Result<TableId, String> {
    match name.split_once('.') {
        Some((s, t)) if !s.is_empty() && !t.is_empty() && !t.contains('.') => {
            Ok(TableId::new(s, t))
        }
        _ => Err(format!("{name:?} is not schema.table")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_for_the_crd_spells_fields_as_the_file_does() {
        let schema = serde_json::to_value(schemars::schema_for!(SubsetSpec)).unwrap();
        let props = schema["properties"].as_object().unwrap();
        for field in [
            "roots",
            "downward",
            "virtualForeignKeys",
            "nullableForeignKeys",
            "maxRounds",
        ] {
            assert!(props.contains_key(field), "{field}: {schema}");
        }
        assert_eq!(schema["required"], serde_json::json!(["roots"]));
    }

    #[test]
    fn a_spec_parses_and_bad_ones_name_the_field() {
        let spec = SubsetSpec::parse(
            "roots:\n  public.customer: {where: \"id < 10\", sample: {percent: 50}}\n\
             downward:\n  - {table: public.rental, references: public.customer, limit: 5}\n\
             virtualForeignKeys:\n  - {table: public.audit, expression: \"(doc->>'c')::int\", \
             references: public.customer, referencedColumns: [id]}\n\
             nullableForeignKeys: set-null\n",
            "f",
        )
        .unwrap();
        assert_eq!(spec.nullable_foreign_keys, NullablePolicy::SetNull);
        assert_eq!(spec.downward[0].limit, Some(5));
        assert_eq!(spec.named_tables().len(), 3);
        for (text, want) in [
            ("roots: {}\n", "f: roots: no root table"),
            (
                "roots: {customer: {}}\n",
                "f: roots.customer: \"customer\" is not schema.table",
            ),
            (
                "roots: {public.a: {sample: {percent: 0}}}\n",
                "f: roots.public.a.sample: percent 0 is not in (0, 100]",
            ),
            (
                "roots: {public.a: {}}\nvirtualForeignKeys: [{table: public.b, columns: [x, y], \
                 references: public.a, referencedColumns: [id]}]\n",
                "f: virtualForeignKeys[0].columns: 2 columns reference 1 (referencedColumns)",
            ),
            (
                "roots: {public.a: {}}\nvirtualForeignKeys: [{table: public.b, references: \
                 public.a, referencedColumns: [id]}]\n",
                "f: virtualForeignKeys[0].columns: give the referencing columns",
            ),
            (
                "roots: {public.a: {}}\nnullableForeignKeys: drop\n",
                "f: nullableForeignKeys",
            ),
            (
                "roots: {public.a: {}}\nupward: []\n",
                "unknown field `upward`",
            ),
            (
                "roots: {public.a: {}}\nmaxRounds: 0\n",
                "f: maxRounds: must be at least 1",
            ),
        ] {
            let e = SubsetSpec::parse(text, "f").unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
