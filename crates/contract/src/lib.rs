//! The contract between the operator and the pods it runs, typed once: the operator builds
//! these values and writes them; the pods read the same types. Nothing here runs anything.
//!
//! - [`engine_file`]: the engine's configuration file (`larch engine --config engine.yaml`),
//!   which the operator writes into an ArchiveSource's ConfigMap.
//! - [`export_request`]: what an export pod runs (`larch export --request '<json>'`).
//! - [`preflight`]: what an export pod reports of its constraint preflight (the summary, a
//!   writer's `/status`), which the operator turns into the `Validated` condition.
//! - [`restore_request`]: what a restore pod runs (`larch restore --request '<json>'`) and the
//!   summary it answers with.
//! - [`transform_rules`]: the masking rules, for the CLI's rules file and the CRD alike.
//! - [`subset_spec`]: a subset that follows foreign keys, for the CLI and the CRD alike.

pub mod engine_file;
pub mod export_request;
pub mod preflight;
pub mod restore_request;
pub mod subset_spec;
pub mod transform_rules;

/// Parses a YAML document (JSON is YAML too) into `T`; an error reads
/// `<path>: <message> at line L, column C`, the path of the field that failed first (none at
/// the top level), the position without a source snippet (these errors are one log line).
pub fn from_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    let options = serde_saphyr::options! { with_snippet: false };
    let mut failed_at = String::new();
    serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            failed_at = e.path().to_string();
            e.into_inner()
        })
    })
    .map_err(|e| {
        let message = e.without_snippet().to_string();
        match failed_at.as_str() {
            "" | "." => message,
            path => format!("{path}: {message}"),
        }
    })
}

/// Parses a request from JSON; an error names `what` and the field's path.
fn from_json<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T, String> {
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let e = e.into_inner();
        if path == "." || path.is_empty() {
            format!("{what}: {e}")
        } else {
            format!("{what}: {path}: {e}")
        }
    })
}
