//! The engine's configuration file as written (YAML; laredo's HOCON is translated into it):
//! what `larch engine` parses and validates (`larch_run::engine::config`) and what the operator
//! writes for an ArchiveSource. Fields keep what a user wrote (an unknown `type`, a
//! `poll_interval` of any YAML kind) so validation can name the path of a bad value; the field
//! order is the order the operator's files list them in.

use std::collections::BTreeMap;
use std::path::PathBuf;

use larch_archive::store::spec::StoreSpec;
use serde::{Deserialize, Serialize};

/// `engine.yaml`: archive sources, and the tables they serve into targets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineFile {
    #[serde(default)]
    pub sources: BTreeMap<String, SourceFile>,
    #[serde(default)]
    pub tables: Vec<TableFile>,
    /// laredo's gRPC API (Connect, gRPC, gRPC-Web) on a listener of its own; none without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc: Option<GrpcFile>,
}

/// `grpc`: where the engine serves laredo's gRPC API.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcFile {
    /// `HOST:PORT` (laredo's `grpc { port = N }` is `0.0.0.0:N`).
    pub listen: String,
    /// Serve it over TLS (HTTP/2 by ALPN) with this certificate and key (PEM files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<GrpcTlsFile>,
}

/// `grpc.tls`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcTlsFile {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// `sources.<id>`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceFile {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<SourceKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreSpec>,
    /// Single table only (a group reads `<schema>.<table>/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_fields: Option<OneOrMany>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<OneOrMany>,
    #[serde(default)]
    pub follow: bool,
    /// Serve the table as it was at this point (a position or an RFC 3339 time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// A duration such as `5s` (any other YAML value is kept for validation to refuse).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_interval: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_path: Option<PathBuf>,
    #[serde(default)]
    pub group: bool,
    /// Refuse an archive whose manifest records no masking transform covering every column.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_transformed: bool,
    /// Also refuse one without a passed `larch archive leak-check` at its head.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_leak_check: bool,
}

/// `sources.*.type`: laredo calls an archive source `file`, larch `archive`; the same source.
/// Any other value is kept, for validation to refuse by its path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    Archive,
    File,
    #[serde(untagged)]
    Unknown(String),
}

/// A string or a list of strings (`format: jsonl` or `format: [jsonl, protobuf]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// `tables[]`: one table of a source and where it goes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableFile {
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub schema: String,
    #[serde(default)]
    pub table: String,
    #[serde(default)]
    pub targets: Vec<TargetFile>,
}

/// `tables[].targets[]`: a memory table served over HTTP, or a PostgreSQL table.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetFile {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<TargetKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_fields: Option<Vec<String>>,
    /// A file holding the connection string (never the string itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_file: Option<PathBuf>,
    /// An environment variable holding the connection string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    /// A postgres target's COPY streams per baseline (1–16, default 1), each over its own
    /// connection into a staging table swapped in at the baseline's commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<u16>,
}

/// `tables[].targets[].type`; any other value is kept, for validation to refuse by its path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetKind {
    Memory,
    Postgres,
    #[serde(untagged)]
    Unknown(String),
}

impl EngineFile {
    /// The file's YAML text.
    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(self).expect("an engine file serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_reads_back_the_same() {
        let text = "sources:
  seed:
    type: archive
    store:
      type: s3
      bucket: b
      prefix: team-a/
      path_style: true
    key_prefix: public.users/
    format:
    - jsonl
    - protobuf
    follow: true
    poll_interval: 5s
    state_path: /var/lib/larch/state/seed.pos
    group: false
    require_transformed: true
tables:
- source: seed
  schema: public
  table: users
  targets:
  - type: memory
    index_fields:
    - email
  - type: postgres
    connection_file: /etc/larch/target/dsn
    schema: public
    table: users
";
        let file: EngineFile = serde_saphyr::from_str(text).unwrap();
        assert_eq!(file.to_yaml(), text);
        assert_eq!(
            file.sources["seed"].kind,
            Some(SourceKind::Archive),
            "a known type is typed"
        );
        let odd: EngineFile =
            serde_saphyr::from_str("sources: {s: {type: kafka}}\ntables: []\n").unwrap();
        assert_eq!(
            odd.sources["s"].kind,
            Some(SourceKind::Unknown("kafka".into())),
            "an unknown type is kept for validation to name"
        );
        let unknown_key = serde_saphyr::from_str::<EngineFile>("sources: {s: {typo: 1}}\n");
        assert!(unknown_key.unwrap_err().to_string().contains("typo"));
    }
}
