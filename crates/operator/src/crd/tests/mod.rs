//! CRD tests: the YAML in `crds/` matches the types (regenerate with `LARCH_UPDATE_GOLDEN=1`),
//! every string, list and map in the schemas is bounded, and the CEL rules accept and reject
//! what they should (evaluated offline with kube's `cel` feature).

use std::path::PathBuf;

use serde_json::{Value, json};

use super::*;

mod cel;

fn repo_path(rel: &str) -> PathBuf {
    // The workspace root: goldens (crds/, builders' testdata) are named from there.
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

/// Compares `actual` with the file at `rel`, or rewrites it when `LARCH_UPDATE_GOLDEN` is set.
pub(crate) fn assert_golden(rel: &str, actual: &str) {
    let path = repo_path(rel);
    if std::env::var_os("LARCH_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with LARCH_UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    assert!(
        expected == actual,
        "{} drifted from the code; run `LARCH_UPDATE_GOLDEN=1 cargo test` and review the diff.\n--- expected\n{expected}\n--- actual\n{actual}",
        path.display()
    );
}

#[test]
fn crds_directory_matches_the_types() {
    for (file, crd) in all() {
        assert_golden(&format!("crds/{file}"), &to_yaml(&crd));
    }
}

#[test]
fn larch_crd_output_is_every_crd_as_multi_doc_yaml() {
    let out = all_yaml();
    let docs: Vec<Value> = out
        .split("\n---\n")
        .map(|d| serde_saphyr::from_str(d.trim_start_matches("---\n")).unwrap())
        .collect();
    let names: Vec<&str> = docs
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "archiveexports.larch.dev",
            "archivesources.larch.dev",
            "archivesourcesets.larch.dev",
            "archiverestores.larch.dev"
        ]
    );
    for d in &docs {
        assert_eq!(d["spec"]["names"]["categories"], json!(["archives"]));
        let scope = if d["spec"]["names"]["kind"] == "ArchiveSourceSet" {
            "Cluster"
        } else {
            "Namespaced"
        };
        assert_eq!(d["spec"]["scope"], scope);
        assert_eq!(d["spec"]["versions"][0]["name"], "v1alpha1");
        assert!(d["spec"]["versions"][0]["subresources"]["status"].is_object());
    }
    assert_eq!(docs[0]["spec"]["names"]["shortNames"], json!(["aexp"]));
    assert_eq!(docs[1]["spec"]["names"]["shortNames"], json!(["asrc"]));
    assert_eq!(docs[2]["spec"]["names"]["shortNames"], json!(["asrcset"]));
}

/// Walks a schema and reports every unbounded string, list or map.
fn unbounded(schema: &Value, path: &str, out: &mut Vec<String>) {
    let Some(obj) = schema.as_object() else {
        return;
    };
    if obj.contains_key("x-kubernetes-preserve-unknown-fields") && !obj.contains_key("properties") {
        return; // opaque pass-through objects (affinity) carry no strings the rules can see
    }
    match obj.get("type").and_then(Value::as_str) {
        Some("string") if !obj.contains_key("enum") && !obj.contains_key("maxLength") => {
            out.push(format!("{path}: string without maxLength"))
        }
        Some("array") if !obj.contains_key("maxItems") => {
            out.push(format!("{path}: array without maxItems"))
        }
        Some("object")
            if obj.contains_key("additionalProperties") && !obj.contains_key("maxProperties") =>
        {
            out.push(format!("{path}: map without maxProperties"))
        }
        _ => {}
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            unbounded(v, &format!("{path}.{k}"), out);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(v) = obj.get(key) {
            unbounded(v, &format!("{path}[{key}]"), out);
        }
    }
}

fn schema_of(crd: &CustomResourceDefinition) -> Value {
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

#[test]
fn every_string_list_and_map_in_spec_and_status_is_bounded() {
    for (file, crd) in all() {
        let schema = schema_of(&crd);
        let mut out = vec![];
        unbounded(&schema["properties"]["spec"], "spec", &mut out);
        unbounded(&schema["properties"]["status"], "status", &mut out);
        assert!(out.is_empty(), "{file}: {out:#?}");
    }
    // The walker itself finds unbounded fields.
    let mut out = vec![];
    unbounded(
        &json!({"properties": {"a": {"type": "string"}, "b": {"type": "array", "items": {"type": "string", "maxLength": 1}}}}),
        "x",
        &mut out,
    );
    assert_eq!(out.len(), 2);
}

#[test]
fn conditions_are_a_map_list_keyed_by_type() {
    for (_, crd) in all() {
        let c = &schema_of(&crd)["properties"]["status"]["properties"]["conditions"];
        assert_eq!(c["x-kubernetes-list-type"], "map");
        assert_eq!(c["x-kubernetes-list-map-keys"], json!(["type"]));
    }
}

// ---- CEL rules, evaluated offline ----

fn cel(crd: &CustomResourceDefinition, obj: &Value, old: Option<&Value>) -> Vec<String> {
    match kube::core::cel::Validator::new().validate(&schema_of(crd), obj, old) {
        Ok(()) => vec![],
        Err(errs) => errs.into_vec().into_iter().map(|e| e.message).collect(),
    }
}

fn with(mut v: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    v.pointer_mut(parent).unwrap()[key] = value;
    v
}

fn without(mut v: Value, pointer: &str) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    v.pointer_mut(parent)
        .unwrap()
        .as_object_mut()
        .unwrap()
        .remove(key);
    v
}

// ---- packaging: the chart's CRDs and values, the examples ----

#[test]
fn chart_crds_are_identical_to_crds_directory() {
    for (file, crd) in all() {
        // Same content as crds/ (both regenerate with LARCH_UPDATE_GOLDEN=1).
        assert_golden(&format!("charts/larch/files/crds/{file}"), &to_yaml(&crd));
        if std::env::var_os("LARCH_UPDATE_GOLDEN").is_some() {
            continue; // crds/ is being rewritten by another test right now
        }
        assert_eq!(
            std::fs::read_to_string(repo_path(&format!("charts/larch/files/crds/{file}"))).unwrap(),
            std::fs::read_to_string(repo_path(&format!("crds/{file}"))).unwrap(),
            "charts/larch/files/crds/{file} differs from crds/{file}"
        );
    }
    let count = std::fs::read_dir(repo_path("charts/larch/files/crds"))
        .unwrap()
        .count();
    assert_eq!(
        count,
        all().len(),
        "no stray files in charts/larch/files/crds"
    );
}

/// Every key of values.yaml is declared in values.schema.json (which forbids unknown keys).
fn undeclared(values: &Value, schema: &Value, path: &str, out: &mut Vec<String>) {
    let Some(map) = values.as_object() else {
        return;
    };
    let props = schema.get("properties").and_then(Value::as_object);
    for (k, v) in map {
        match props.and_then(|p| p.get(k)) {
            Some(s) => undeclared(v, s, &format!("{path}.{k}"), out),
            None if schema
                .get("additionalProperties")
                .is_some_and(|a| a != false) => {}
            None if props.is_none() => {}
            None => out.push(format!("{path}.{k}")),
        }
    }
}

#[test]
fn chart_values_are_declared_in_the_values_schema() {
    let values: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(repo_path("charts/larch/values.yaml")).unwrap(),
    )
    .unwrap();
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_path("charts/larch/values.schema.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(schema["additionalProperties"], false);
    let mut out = vec![];
    undeclared(&values, &schema, "", &mut out);
    assert!(out.is_empty(), "undeclared values: {out:?}");
    let mut out = vec![];
    undeclared(&json!({"image": {"repo": "x"}}), &schema, "", &mut out);
    assert_eq!(out, [".image.repo"], "the check itself finds typos");
}

#[test]
fn examples_parse_and_pass_the_cel_rules() {
    let mut seen = 0;
    // examples/fleet holds cluster-scoped kinds, applied on their own (not by e2e/examples.sh).
    let paths = ["examples", "examples/fleet"]
        .iter()
        .flat_map(|d| std::fs::read_dir(repo_path(d)).unwrap())
        .map(|e| e.unwrap().path());
    for path in paths {
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for v in serde_saphyr::from_multiple::<Value>(&text).unwrap() {
            let crd = match v["kind"].as_str() {
                Some("ArchiveExport") => {
                    serde_json::from_value::<ArchiveExport>(v.clone()).unwrap();
                    ArchiveExport::crd()
                }
                Some("ArchiveSource") => {
                    serde_json::from_value::<ArchiveSource>(v.clone()).unwrap();
                    ArchiveSource::crd()
                }
                Some("ArchiveSourceSet") => {
                    serde_json::from_value::<ArchiveSourceSet>(v.clone()).unwrap();
                    ArchiveSourceSet::crd()
                }
                _ => continue,
            };
            assert_eq!(
                cel(&crd, &v, None),
                Vec::<String>::new(),
                "{}",
                path.display()
            );
            seen += 1;
        }
    }
    assert!(
        seen >= 4,
        "examples cover OneShot, Continuous, an ArchiveSource and an ArchiveSourceSet"
    );
}
