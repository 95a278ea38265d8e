//! The operator's side of the CLI contract, checked against the real parsers: every container
//! command the operator generates (golden outputs in crates/operator/src/builders/testdata) parses as a
//! `larch` command line, and every engine config it writes passes `larch engine`'s validation.
//! The operator code itself does not link the export or engine; this test ties them together.

use std::path::Path;

use clap::Parser;
use serde_json::Value;

fn golden_docs() -> Vec<(String, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/operator/src/builders/testdata");
    let mut out = vec![];
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with(".golden.yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let v: Value = serde::Deserialize::deserialize(doc).unwrap();
            out.push((name.clone(), v));
        }
    }
    out
}

fn pod_spec(doc: &Value) -> Option<&Value> {
    match doc["kind"].as_str()? {
        "Job" => Some(&doc["spec"]["template"]["spec"]),
        "CronJob" => Some(&doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]),
        "Deployment" | "StatefulSet" => Some(&doc["spec"]["template"]["spec"]),
        _ => None,
    }
}

#[test]
fn generated_commands_parse_as_larch_command_lines() {
    let mut checked = 0;
    for (file, doc) in golden_docs() {
        let Some(spec) = pod_spec(&doc) else { continue };
        for c in spec["containers"].as_array().unwrap() {
            assert_eq!(c["command"], serde_json::json!(["larch"]), "{file}");
            let mut argv = vec!["larch".to_string()];
            argv.extend(
                c["args"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap().to_string()),
            );
            if let Err(e) = larch::cli::Cli::try_parse_from(&argv) {
                panic!("{file}: {} does not parse: {e}", argv.join(" "));
            }
            checked += 1;
        }
    }
    assert!(
        checked >= 8,
        "Jobs, CronJobs, Deployments and StatefulSets were checked ({checked})"
    );
}

#[test]
fn generated_engine_configs_pass_the_engine_validation() {
    let mut checked = 0;
    for (file, doc) in golden_docs() {
        if doc["kind"] != "ConfigMap" {
            continue;
        }
        let text = doc["data"]["engine.yaml"].as_str().unwrap();
        if let Err(e) = larch::engine::config::EngineConfig::parse("engine.yaml", text) {
            panic!("{file}: the engine rejects the generated config: {e}\n{text}");
        }
        checked += 1;
    }
    // One engine ConfigMap per engine StatefulSet of the ArchiveSource goldens.
    let sources = golden_docs()
        .into_iter()
        .filter(|(file, doc)| file.starts_with("source-") && doc["kind"] == "StatefulSet")
        .count();
    assert!(
        sources >= 4,
        "the engine StatefulSets of the goldens were found ({sources})"
    );
    assert_eq!(checked, sources);
}
