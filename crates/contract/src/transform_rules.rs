//! The masking rules of an export, one type for the CLI's rules file (`larch export
//! --transform`), an ArchiveExport's `spec.transform` and the [`ExportRequest`] the operator
//! hands its pods: the operator validates exactly what the exporter runs. Applying them (the
//! keyed hash, the fakes) is the exporter's (`larch_run::export::transform`).
//!
//! [`ExportRequest`]: crate::export_request::ExportRequest

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use larch_archive::model::{ColumnSelection, TableId};
use serde::{Deserialize, Serialize};

/// The rules of a transform file / `spec.transform`: tables by `schema.table`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TransformRules {
    /// `schema.table` → its rules.
    #[serde(default)]
    #[schemars(extend("maxProperties" = 256))]
    pub tables: BTreeMap<String, TableRules>,
    /// Row filters (`where:`) may use `EXISTS (SELECT …)` and `x IN (SELECT …)` into tables the
    /// same export also exports, reading only the columns those export unmasked (default
    /// false: no subquery; docs/security.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub subqueries: bool,
}

/// One table's rules.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TableRules {
    /// What every column not named in `columns` goes through, one added to the table later
    /// included (default `null`: a column nobody declared never goes out raw). `keep` passes
    /// them through; `hash`, `drop` or `{redact: …}` mask them otherwise.
    #[serde(default)]
    pub undeclared: ColumnRule,
    /// Column name → its transform.
    #[serde(default)]
    #[schemars(extend("maxProperties" = 1600))]
    pub columns: BTreeMap<String, ColumnRule>,
    /// Subsetting (one-shot exports only): an SQL predicate on the table's columns; only the
    /// rows it keeps are exported. Parsed by PostgreSQL's parser: columns of the table,
    /// constants, operators, casts to built-in types and immutable functions only; subqueries
    /// into this export's tables with `subqueries: true` (docs/security.md).
    #[serde(default, rename = "where", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub row_filter: Option<String>,
    /// Subsetting (one-shot exports only): keep this percentage of the rows, chosen by a keyed
    /// hash of a column (deterministic, and alike across tables for the same values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<SampleRule>,
}

/// One column's transform: `keep`, `null`, `drop`, `hash`, `permute`, `{redact: <constant>}` or
/// `{fake: KIND}`. Read
/// through a JSON value so a bare YAML `null` means the transform `null`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "serde_json::Value", into = "serde_json::Value")]
pub enum ColumnRule {
    Keep,
    /// The default: what a column nobody declared goes through.
    #[default]
    Null,
    Drop,
    Hash,
    /// Every non-NULL value becomes this constant.
    Redact(serde_json::Value),
    /// A realistic value of this kind picked by the keyed hash of the value.
    Fake(FakeKind),
    /// A keyed, format-preserving permutation: unique in, unique out (a `UNIQUE` column stays
    /// unique), reversible only with the key.
    Permute,
}

impl TryFrom<serde_json::Value> for ColumnRule {
    type Error = String;
    fn try_from(v: serde_json::Value) -> Result<ColumnRule, String> {
        use serde_json::Value as J;
        match v {
            J::Null => Ok(ColumnRule::Null),
            J::String(s) => match s.as_str() {
                "keep" => Ok(ColumnRule::Keep),
                "null" => Ok(ColumnRule::Null),
                "drop" => Ok(ColumnRule::Drop),
                "hash" => Ok(ColumnRule::Hash),
                "permute" => Ok(ColumnRule::Permute),
                other => Err(format!(
                    "unknown transform {other:?}: expected keep, null, drop, hash, permute, \
                     {{redact: VALUE}} or {{fake: KIND}}"
                )),
            },
            J::Object(m) if m.len() == 1 && m.contains_key("redact") => Ok(ColumnRule::Redact(
                m.into_iter().next().expect("one entry").1,
            )),
            J::Object(m) if m.len() == 1 && m.contains_key("fake") => match &m["fake"] {
                J::String(k) => FakeKind::parse(k).map(ColumnRule::Fake).ok_or_else(|| {
                    format!("unknown fake {k:?}: expected one of {}", FakeKind::names())
                }),
                other => Err(format!(
                    "fake takes a kind ({}), not {other}",
                    FakeKind::names()
                )),
            },
            other => Err(format!(
                "a transform is keep, null, drop, hash, permute, {{redact: VALUE}} or {{fake: \
                 KIND}}, not {other}"
            )),
        }
    }
}

impl From<ColumnRule> for serde_json::Value {
    fn from(r: ColumnRule) -> serde_json::Value {
        match r {
            ColumnRule::Redact(v) => serde_json::json!({ "redact": v }),
            ColumnRule::Fake(k) => serde_json::json!({ "fake": k.name() }),
            other => serde_json::Value::String(other.name().into()),
        }
    }
}

impl schemars::JsonSchema for ColumnRule {
    fn schema_name() -> Cow<'static, str> {
        "ColumnRule".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // A string or a one-key object: not structural, so the API server keeps it as given.
        schemars::json_schema!({
            "description": "keep, null, drop, hash, permute, {redact: VALUE} or {fake: KIND}",
            "x-kubernetes-preserve-unknown-fields": true
        })
    }
}

impl ColumnRule {
    pub fn name(&self) -> &'static str {
        match self {
            ColumnRule::Keep => "keep",
            ColumnRule::Null => "null",
            ColumnRule::Drop => "drop",
            ColumnRule::Hash => "hash",
            ColumnRule::Redact(_) => "redact",
            ColumnRule::Fake(_) => "fake",
            ColumnRule::Permute => "permute",
        }
    }

    /// The name the manifest records: a fake says its kind (`fake:email`).
    pub fn record_name(&self) -> String {
        match self {
            ColumnRule::Fake(k) => format!("fake:{k}"),
            other => other.name().to_string(),
        }
    }

    /// Whether the rule needs the key.
    pub fn keyed(&self) -> bool {
        matches!(
            self,
            ColumnRule::Hash | ColumnRule::Fake(_) | ColumnRule::Permute
        )
    }
}

/// A rule that cannot be applied; names the file, table and column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransformError(pub String);

impl fmt::Display for TransformError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TransformError {}

fn err<T>(msg: impl Into<String>) -> Result<T, TransformError> {
    Err(TransformError(msg.into()))
}

impl TransformRules {
    /// Parses a rules file (YAML; JSON is YAML too); errors name the file and the key.
    pub fn from_file(path: &Path) -> Result<TransformRules, TransformError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| TransformError(format!("reading --transform {}: {e}", path.display())))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses rules from `text`; `origin` names where they came from in errors.
    pub fn parse(text: &str, origin: &str) -> Result<TransformRules, TransformError> {
        let rules: TransformRules = crate::from_yaml(text)
            .map_err(|e| TransformError(format!("transform rules {origin}: {e}")))?;
        for name in rules.tables.keys() {
            if name.parse::<TableId>().is_err() {
                return err(format!(
                    "transform rules {origin}: table {name:?} must be schema.table"
                ));
            }
        }
        Ok(rules)
    }

    /// The columns of `table` these rules export unmasked (`keep`): all but the masked ones
    /// with `undeclared: keep`, else only those named `keep`; none of a table they do not name
    /// (its export is refused).
    pub fn unmasked_columns(&self, table: &TableId) -> ColumnSelection {
        let Some(rules) = self.tables.get(&table.to_string()) else {
            return ColumnSelection::Only(Default::default());
        };
        let named = |keep: bool| {
            rules
                .columns
                .iter()
                .filter(|(_, rule)| (**rule == ColumnRule::Keep) == keep)
                .map(|(name, _)| name.clone())
                .collect()
        };
        match rules.undeclared {
            ColumnRule::Keep => ColumnSelection::AllBut(named(false)),
            _ => ColumnSelection::Only(named(true)),
        }
    }

    /// Whether any rule of any table hashes or fakes (a key is then needed).
    pub fn hashes(&self) -> bool {
        self.tables
            .values()
            .any(|t| t.undeclared.keyed() || t.columns.values().any(ColumnRule::keyed))
    }
}

/// What a `fake` produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FakeKind {
    FirstName,
    LastName,
    FullName,
    Email,
    Phone,
    StreetAddress,
    City,
}

impl FakeKind {
    pub const ALL: [FakeKind; 7] = [
        FakeKind::FirstName,
        FakeKind::LastName,
        FakeKind::FullName,
        FakeKind::Email,
        FakeKind::Phone,
        FakeKind::StreetAddress,
        FakeKind::City,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FakeKind::FirstName => "first_name",
            FakeKind::LastName => "last_name",
            FakeKind::FullName => "full_name",
            FakeKind::Email => "email",
            FakeKind::Phone => "phone",
            FakeKind::StreetAddress => "street_address",
            FakeKind::City => "city",
        }
    }

    pub fn parse(s: &str) -> Option<FakeKind> {
        Self::ALL.into_iter().find(|k| k.name() == s)
    }

    /// The names of every kind, for error messages.
    pub fn names() -> String {
        Self::ALL.map(FakeKind::name).join(", ")
    }

    /// The shortest length (in characters) a fake of this kind can be cut to and stay of its
    /// kind; a `varchar(n)` below it is refused at validation.
    pub fn min_length(self) -> i64 {
        match self {
            FakeKind::FirstName | FakeKind::LastName | FakeKind::City => 3,
            FakeKind::FullName => 5,
            // "a.b@example.com"
            FakeKind::Email => 15,
            // "+1 AAA-555-01NN"
            FakeKind::Phone => 15,
            FakeKind::StreetAddress => 8,
        }
    }
}

impl fmt::Display for FakeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `sample:` of a table's rules.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SampleRule {
    /// Percentage of the rows kept, in (0, 100].
    #[schemars(range(min = 0.0, max = 100.0))]
    pub percent: f64,
    /// The column whose value decides (default: the key fields). Tables sampled by columns
    /// holding the same values (a key and its foreign keys) keep matching rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub by: Option<String>,
}
