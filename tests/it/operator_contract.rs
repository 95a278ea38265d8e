//! The operator's side of the CLI contract, checked against the real parsers: every container
//! command the operator generates (golden outputs in crates/operator/src/builders/testdata) parses as a
//! `larch` command line, and every engine config it writes passes `larch engine`'s validation.
//! Export and restore pods run one `--request '<json>'`: it parses into the request the command
//! runs. The operator code itself does not link the export or engine; this test ties them
//! together.

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
        for v in serde_saphyr::from_multiple::<Value>(&text).unwrap() {
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
    let mut requests = 0;
    for (file, doc) in golden_docs() {
        let Some(spec) = pod_spec(&doc) else { continue };
        for c in spec["containers"].as_array().unwrap() {
            assert_eq!(c["command"], serde_json::json!(["larch"]), "{file}");
            let mut argv = vec!["larch".to_string()];
            // As the kubelet expands it from the container's environment (an Indexed Job's
            // worker index).
            argv.extend(c["args"].as_array().unwrap().iter().map(|a| {
                let a = a.as_str().unwrap();
                a.replace("$(JOB_COMPLETION_INDEX)", "0")
            }));
            let cli = match larch::cli::Cli::try_parse_from(&argv) {
                Ok(cli) => cli,
                Err(e) => panic!("{file}: {} does not parse: {e}", argv.join(" ")),
            };
            requests += request_parses(&file, cli);
            checked += 1;
        }
    }
    assert!(
        checked >= 8,
        "Jobs, CronJobs, Deployments and StatefulSets were checked ({checked})"
    );
    // Every export pod (Jobs, CronJobs, Deployments) and restore Job runs a request.
    assert!(
        requests >= 6,
        "export and restore requests were checked ({requests})"
    );
}

/// A `larch export`/`larch restore` container's `--request` parses in the binary into the
/// request the command runs: 1 when the command carries one.
fn request_parses(file: &str, cli: larch::cli::Cli) -> usize {
    use larch::cli::Command;
    let parsed = match cli.command {
        // `larch export cleanup` and the slot monitor: subcommands with flags of their own.
        Command::Export(args) if args.command.is_some() => return 0,
        Command::Export(args) if args.request.is_some() => args
            .request()
            .map(|r| assert!(!r.tables.is_empty(), "{file}")),
        Command::Restore(args) if args.request.is_some() => args
            .request()
            .map(|r| assert!(!r.tables.is_empty(), "{file}")),
        Command::Export(_) | Command::Restore(_) => {
            panic!("{file}: an export or restore pod without --request")
        }
        _ => return 0,
    };
    if let Err(e) = parsed {
        panic!("{file}: the request does not parse: {e:#}");
    }
    1
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

/// `requireTransformed` reaches the engine config, and the engine's validation takes it.
#[test]
fn require_transformed_passes_the_engine_validation() {
    use larch::operator::builders::engine_config;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/operator/src/builders/testdata");
    let text = std::fs::read_to_string(dir.join("source-s3-postgres.input.yaml")).unwrap();
    let mut source: larch::operator::crd::ArchiveSource = serde_saphyr::from_str(&text).unwrap();
    source.spec.require_transformed = Some(true);
    let archive = engine_config::resolve(&source, None).unwrap();
    let yaml = engine_config::engine_yaml(&engine_config::engine_config(&source, &archive));
    let config = larch::engine::config::EngineConfig::parse("engine.yaml", &yaml)
        .unwrap_or_else(|e| panic!("the engine rejects the generated config: {e}\n{yaml}"));
    assert!(
        config.sources.iter().all(|s| s.require_transformed),
        "{yaml}"
    );
}
