//! What `larch export` is asked to do, typed once: the operator builds an [`ExportRequest`]
//! for each export pod and hands it over as one argument (`larch export --request '<json>'`);
//! `larch export`'s flags parse into the same type; `larch_run::export::run` runs it.
//!
//! Each field is one flag of `larch export` (named in its comment). Values users write as text
//! (durations, ages, fractions) stay text here, in the flags' syntax, and are checked when the
//! request runs (an error names the field). Credentials are never part of a request: the
//! source's connection string is a file (a mounted Secret) or `LARCH_PG_DSN`, the S3 keys come
//! from the environment, the masking key from a file or `LARCH_TRANSFORM_KEY`.

use std::path::PathBuf;

use larch_archive::format::Format;
use larch_archive::store::spec::StoreSpec;
use serde::{Deserialize, Serialize};

use crate::transform_rules::TransformRules;

/// One `larch export` run: one table (one-shot or `follow`), or several at one position.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExportRequest {
    /// `--connection-file`: the file holding the source's connection string; without it,
    /// `LARCH_PG_DSN`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_file: Option<PathBuf>,
    /// `--schema`: the schema of every table; the names in `tables` are then taken as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// `--table`: `[schema.]name` each. Several: a one-shot export at one position.
    pub tables: Vec<String>,
    /// `--parallel`: how many of several tables are copied at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<u16>,
    /// `--split`: one table's one-shot export read in this many ctid ranges at once, each
    /// over its own connection importing the one snapshot, joined into one snapshot object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<u16>,
    /// `--split-workers`: with `split`, the ranges are copied by this many separate worker
    /// processes (`larch export split-worker`, the pods of an Indexed Job); this process is
    /// their coordinator: it holds the exported snapshot, writes the plan into the store,
    /// waits for every range and commits. It copies no range itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_workers: Option<u16>,
    /// `--split-workers-start-timeout`: how long the coordinator waits for each worker to
    /// start (default 10m) before it fails the run and releases the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_workers_start_timeout: Option<String>,
    /// `--store …`: where the archive lives.
    pub store: StoreSpec,
    /// `--key-prefix`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
    /// `--format` (default: jsonl).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub formats: Vec<Format>,
    /// `--key-fields`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key_fields: Vec<String>,
    /// `--summary-file`: the summary (or the failure) also goes there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_file: Option<PathBuf>,
    /// `--slot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
    /// `--publication`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publication: Option<String>,
    /// `--owner`: who the export runs for, recorded with the publication it creates and checked
    /// before any drop (default `cli`; the operator's `archiveexport/<namespace>/<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// `--slot-mode` (with `follow` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_mode: Option<SlotMode>,
    /// `--follow`: a continuous export until stopped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub follow: bool,
    /// `--diff-interval` (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff_interval: Option<String>,
    /// `--min-interval`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_interval: Option<String>,
    /// `--max-interval`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_interval: Option<String>,
    /// `--max-diff-bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_diff_bytes: Option<u64>,
    /// `--max-diff-fraction`, a decimal such as `0.5`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_diff_fraction: Option<String>,
    /// `--max-churn-records`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_churn_records: Option<u64>,
    /// `--max-churn-fraction`, a decimal such as `0.5`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_churn_fraction: Option<String>,
    /// `--keep-epochs` (0: keep all).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub keep_epochs: u32,
    /// `--max-age`: whole days (`7d`) or a duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<String>,
    /// `--listen`: the HTTP listener (`$(POD_IP):8080` in a pod, which Kubernetes expands).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// `--slot-loss-report-wait`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_loss_report_wait: Option<String>,
    /// `--lease`: the coordination.k8s.io Lease held while writing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// `--lease-namespace` (in a pod: `POD_NAMESPACE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_namespace: Option<String>,
    /// `--lease-identity` (in a pod: `POD_NAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_identity: Option<String>,
    /// `--lease-duration` (default 15s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_duration: Option<String>,
    /// `--buffer-memory` in bytes (default 64Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_memory: Option<u64>,
    /// `--spill-dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spill_dir: Option<PathBuf>,
    /// `--spill-limit` in bytes (0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spill_limit: Option<u64>,
    /// `--transform`/`--transform-rules`: the masking rules themselves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<TransformRules>,
    /// `--transform-key-file`: the file holding the hash key (default: `LARCH_TRANSFORM_KEY`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform_key_file: Option<PathBuf>,
    /// `--leak-check`: after a one-shot export with a transform, check every archive it wrote
    /// for raw values of the masked columns and record the result in its manifest.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leak_check: bool,
    /// `--require-validated`: with a transform, refuse to export (reason `ConstraintsAtRisk`,
    /// nothing written) when the constraint preflight finds a constraint it can break.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_validated: bool,
    /// `--where`: the row filter of a one-shot export of one table.
    #[serde(default, rename = "where", skip_serializing_if = "Option::is_none")]
    pub row_filter: Option<String>,
    /// `--where-subqueries`: row filters may use subqueries into the export's tables.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub where_subqueries: bool,
    /// `--sample`: the percentage of rows kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<f64>,
    /// `--sample-by`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_by: Option<String>,
    /// `--subset`: a subset that follows foreign keys (a one-shot export of a set of tables).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subset: Option<crate::subset_spec::SubsetSpec>,
    /// `--statement-timeout` (default 1m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statement_timeout: Option<String>,
    /// `--lock-timeout` (default 10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_timeout: Option<String>,
    /// `--idle-in-transaction-timeout` (default 1m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_in_transaction_timeout: Option<String>,
    /// `--snapshot-max-age` (default 24h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_max_age: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// `--slot-mode`: whether a `follow` export's slot survives the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotMode {
    Persistent,
    Temporary,
}

impl ExportRequest {
    /// The request as `larch export --request` takes it (one line of JSON).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an export request serializes")
    }

    /// Parses `larch export --request`; an error names the field.
    pub fn from_json(text: &str) -> Result<ExportRequest, String> {
        crate::from_json("export request", text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_through_its_json() {
        let request = ExportRequest {
            connection_file: Some("/etc/larch/source/dsn".into()),
            tables: vec!["public.users".into()],
            store: StoreSpec::local("/archive"),
            formats: vec![Format::Protobuf],
            slot_mode: Some(SlotMode::Persistent),
            follow: true,
            diff_interval: Some("15s".into()),
            keep_epochs: 3,
            row_filter: Some("id > 10".into()),
            ..Default::default()
        };
        let text = request.to_json();
        assert!(text.contains(r#""where":"id > 10""#), "{text}");
        let split = ExportRequest {
            split: Some(8),
            split_workers: Some(3),
            ..request.clone()
        };
        let split_text = split.to_json();
        assert!(
            split_text.contains(r#""split":8,"splitWorkers":3"#),
            "{split_text}"
        );
        assert_eq!(ExportRequest::from_json(&split_text).unwrap(), split);
        assert_eq!(ExportRequest::from_json(&text).unwrap(), request);
    }

    #[test]
    fn a_bad_request_is_refused_naming_the_field() {
        let e = ExportRequest::from_json(
            r#"{"tables":["t"],"store":{"type":"local"},"keepEpochs":"three"}"#,
        )
        .unwrap_err();
        assert!(e.starts_with("export request: keepEpochs: "), "{e}");
        let e = ExportRequest::from_json(r#"{"tables":["t"],"store":{"type":"local"},"dsn":"x"}"#)
            .unwrap_err();
        assert!(e.contains("unknown field `dsn`"), "{e}");
        let e = ExportRequest::from_json(r#"{"tables":["t"]}"#).unwrap_err();
        assert!(e.contains("missing field `store`"), "{e}");
    }
}
