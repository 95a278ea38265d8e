//! What `larch restore` is asked to do and what it answers, typed once: the operator builds a
//! [`RestoreRequest`] for an ArchiveRestore's Job and hands it over as one argument
//! (`larch restore --request '<json>'`); `larch restore`'s flags parse into the same type;
//! `larch_run::restore::run` runs it. The pod's [`RestoreSummary`] (its termination message) is
//! what the operator reads back. The target's connection string is never part of a request: a
//! file (a mounted Secret) or `LARCH_PG_DSN`.

use std::path::PathBuf;

use larch_archive::format::Format;
use larch_archive::store::spec::StoreSpec;
use serde::{Deserialize, Serialize};

/// One `larch restore` run. Each field is one flag (named in its comment).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RestoreRequest {
    /// `--store …`: where the archive lives.
    pub store: StoreSpec,
    /// `--table`: `[schema.]name` each; several restore at one point, in one transaction.
    pub tables: Vec<String>,
    /// `--key-prefix-root`: the prefix before each table's `<schema>.<table>/`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key_prefix_root: String,
    /// `--key-prefix`: one table's archive's exact key prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
    /// `--format`: the formats to read, in preference order (default: every format).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub formats: Vec<Format>,
    /// `--at`: a position or an RFC 3339 time; default the head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// `--if-exists`.
    #[serde(default)]
    pub if_exists: IfExists,
    /// `--split`: COPY streams per table the restore creates (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<u16>,
    /// `--connection-file`: the file holding the target's connection string; without it,
    /// `LARCH_PG_DSN`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_file: Option<PathBuf>,
    /// `--buffer-memory` in bytes (default 64Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_memory: Option<u64>,
    /// `--spill-dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spill_dir: Option<PathBuf>,
    /// `--summary-file`: the summary (or the failure) also goes there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_file: Option<PathBuf>,
    /// `--listen`: the HTTP listener of `/status` (progress) and `/metrics` while it runs
    /// (`$(POD_IP):8080` in a pod, which Kubernetes expands).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
}

impl RestoreRequest {
    /// The request as `larch restore --request` takes it (one line of JSON).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a restore request serializes")
    }

    /// Parses `larch restore --request`; an error names the field.
    pub fn from_json(text: &str) -> Result<RestoreRequest, String> {
        crate::from_json("restore request", text)
    }
}

/// What to do when a destination table exists.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum IfExists {
    /// Stop with an error naming the table; nothing is restored.
    #[default]
    Fail,
    /// Empty it and load the archived rows (its definition is kept).
    Replace,
}

/// One table restored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableRestored {
    pub table: String,
    pub rows: u64,
    /// The position the table's rows are at (its last diff at or before the point).
    pub position: String,
    /// When the last artifact restored was written to the archive (RFC 3339): the changes it
    /// holds were committed before.
    pub archived_at: String,
    /// `created` or `replaced`.
    pub action: String,
    /// The COPY streams its rows went through (`--split`; 1 for a table that existed).
    #[serde(default = "one_stream")]
    pub streams: u32,
}

fn one_stream() -> u32 {
    1
}

/// What `larch restore` prints (and writes to `--summary-file`) when it is done.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RestoreSummary {
    /// The point every table was restored at (`--at`, else the greatest every table reaches).
    pub position: String,
    /// `--at` as given, when given.
    pub at: Option<String>,
    pub tables: Vec<TableRestored>,
    pub duration_seconds: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_and_a_bad_one_names_its_field() {
        let request = RestoreRequest {
            store: StoreSpec::local("/archive"),
            tables: vec!["sales.invoices".into()],
            if_exists: IfExists::Replace,
            at: Some("0/16B3748".into()),
            ..Default::default()
        };
        assert_eq!(
            RestoreRequest::from_json(&request.to_json()).unwrap(),
            request
        );
        let e = RestoreRequest::from_json(
            r#"{"store":{"type":"local"},"tables":["t"],"ifExists":"merge"}"#,
        )
        .unwrap_err();
        assert!(e.starts_with("restore request: ifExists: "), "{e}");
    }
}
