//! What an archive's rows went through before they were written: the manifest's additive
//! `transform` field (laredo ignores it). It names each column's transform and the key's id (a
//! fingerprint, never the key), so a reader can tell a masked archive from a raw one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The manifest's `transform` field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TransformRecord {
    /// Fingerprint of the hash key (`hmac-sha256:<16 hex>`); absent when nothing is hashed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// The version of the hash algorithm (`larch-hash-2`); absent when nothing is hashed, and
    /// in archives of version 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    /// The version of the unique (`permute`) transform (`larch-permute-1`); absent when no
    /// column is permuted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permute: Option<String>,
    /// What a column not declared (one added later included) goes through.
    #[serde(default)]
    pub undeclared: String,
    /// Column name → its transform (`keep`, `null`, `redact`, `drop`, `hash`). Dropped columns
    /// are listed here although they are gone from `columns`.
    #[serde(default)]
    pub columns: BTreeMap<String, String>,
    /// The columns of `columns` the rules did not name: they went through `undeclared`.
    /// Absent in archives written before larch recorded it (their columns count as declared).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub undeclared_columns: Vec<String>,
    /// The last `larch archive leak-check` of this epoch (counts only, never a value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leak_check: Option<LeakCheckRecord>,
}

/// The manifest's `transform.leak_check`: which raw values of the masked columns were looked
/// for in the epoch's objects, at which position, and how many were found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LeakCheckRecord {
    /// The epoch and head position the check read up to.
    pub epoch: i64,
    pub position: String,
    /// Column → raw values looked for and found (never the values).
    pub columns: BTreeMap<String, LeakCheckColumn>,
    pub values_checked: u64,
    pub found: u64,
    /// RFC 3339 time the check finished.
    pub checked_at: String,
    pub larch_version: String,
}

/// One column's figures in a [`LeakCheckRecord`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LeakCheckColumn {
    pub values_checked: u64,
    pub found: u64,
}

impl LeakCheckRecord {
    /// Whether the check passed at exactly this manifest's epoch and head.
    pub fn passed_at(&self, epoch: i64, head: &str) -> bool {
        self.found == 0 && self.epoch == epoch && crate::position::same(&self.position, head)
    }
}

impl TransformRecord {
    /// Whether any column is changed (an archive with only `keep` is not masked).
    pub fn masks_anything(&self) -> bool {
        self.columns.values().any(|t| t != "keep") || self.undeclared != "keep"
    }

    /// Whether a column the rules did not name is masked (`null`, `drop`, `hash`, a redaction
    /// or a fake: anything but `keep`).
    fn undeclared_masked(&self) -> bool {
        !matches!(self.undeclared.as_str(), "keep" | "")
    }

    /// The columns of `served` (a manifest's columns) this record does not cover: neither
    /// named by the rules (any transform, `keep` included: a decision) nor masked by the
    /// undeclared policy. A column added after the rules were written is covered only by a
    /// masking undeclared policy.
    pub fn uncovered<'a>(&self, served: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        let masked = self.undeclared_masked();
        served
            .into_iter()
            .filter(|c| {
                let declared = self.columns.contains_key(*c)
                    && !self.undeclared_columns.iter().any(|u| u == c);
                !declared && !masked
            })
            .map(str::to_string)
            .collect()
    }
}

/// The manifest's `subset` field: the rows a one-shot export kept (dev seeds).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SubsetRecord {
    /// The SQL predicate the snapshot's rows satisfy, as given.
    #[serde(default, rename = "where", skip_serializing_if = "Option::is_none")]
    pub row_filter: Option<String>,
    /// The percentage of rows sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_percent: Option<serde_json::Number>,
    /// The columns whose keyed hash decided the sample.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sample_by: Vec<String>,
    /// A subset that follows foreign keys: its spec and the closure it computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closure: Option<ClosureRecord>,
}

/// The manifest's `subset.closure`: the spec (as given), the closure computed at `position`
/// (the snapshot every table of the set shares) and the rows it kept in each table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ClosureRecord {
    pub spec: serde_json::Value,
    pub position: String,
    /// Rounds after the roots until a round added nothing.
    pub rounds: u32,
    /// `schema.table` → rows kept (every table of the set).
    pub tables: BTreeMap<String, u64>,
    pub relationships: Vec<ClosureRelationship>,
}

/// One relationship of a [`ClosureRecord`] and how it was followed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ClosureRelationship {
    /// The constraint's name, or `virtualForeignKeys[i]`.
    pub name: String,
    /// `child(columns) → parent(columns)`.
    pub relationship: String,
    /// `upward`, `upward+downward` or `set-null`.
    pub followed: String,
}
