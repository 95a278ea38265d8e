//! Every laredo fixture under `tests/fixtures/laredo`, through the library.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use larch::archive::format::Format;
use larch::archive::reader::ArchiveReader;
use larch::archive::store::local::LocalStore;
use larch::archive::value::{Row, values_equal};
use serde_json::Value;
use serde_json::value::RawValue;

pub fn fixtures_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/laredo");
    assert!(dir.is_dir(), "fixtures not found at {}", dir.display());
    dir
}

pub fn cases() -> Vec<(String, PathBuf, Value)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(fixtures_dir()).unwrap() {
        let dir = entry.unwrap().path();
        let case = dir.join("case.json");
        if case.is_file() {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&case).unwrap()).unwrap();
            out.push((
                dir.file_name().unwrap().to_string_lossy().to_string(),
                dir,
                v,
            ));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        out.len() >= 9,
        "expected the nine laredo fixtures, found {}",
        out.len()
    );
    out
}

/// Converts an expected row (with `{"$num": "<text>"}` markers) into (row, exact-number checks).
fn expected_row(v: &Value) -> (Row, Vec<(String, String)>) {
    let mut exact = Vec::new();
    let mut map = serde_json::Map::new();
    for (k, val) in v.as_object().expect("expected rows are objects") {
        if let Some(text) = val.get("$num").and_then(Value::as_str) {
            exact.push((k.clone(), text.to_string()));
            map.insert(
                k.clone(),
                Value::Number(text.parse().unwrap_or_else(|_| serde_json::Number::from(0))),
            );
        } else {
            map.insert(k.clone(), val.clone());
        }
    }
    (Row::parse(&Value::Object(map).to_string()).unwrap(), exact)
}

/// Asserts that `got` (rows as JSON texts) equals the expected rows in any order.
pub fn assert_rows_match(case: &str, got: &[String], expected: &[Value]) {
    assert_eq!(got.len(), expected.len(), "{case}: row count; got {got:?}");
    let mut unmatched: Vec<&String> = got.iter().collect();
    for e in expected {
        let (want, exact) = expected_row(e);
        let pos = unmatched.iter().position(|g| {
            let g_raw = RawValue::from_string((*g).clone()).unwrap();
            let w_raw = RawValue::from_string(want.as_str().to_string()).unwrap();
            values_equal(&g_raw, &w_raw)
        });
        let Some(pos) = pos else {
            panic!("{case}: expected row {e} not found in {got:?}")
        };
        let g = unmatched.remove(pos);
        let row = Row::parse(g).unwrap();
        for (field, text) in exact {
            // Every digit must survive: compare the stored text exactly.
            let raw_row: serde_json::Map<String, Value> = serde_json::from_str(g).unwrap();
            assert!(raw_row.contains_key(&field), "{case}: missing {field}");
            let v = row.get(&field).unwrap();
            assert_eq!(v.get(), text, "{case}: {field} lost digits");
        }
    }
}

fn formats(case: &Value) -> Vec<Format> {
    case["formats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| Format::parse(f.as_str().unwrap()).unwrap())
        .collect()
}

fn key_fields(case: &Value) -> Vec<String> {
    case["key_fields"]
        .as_array()
        .map(|a| a.iter().map(|k| k.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn every_laredo_fixture_through_the_library() {
    for (name, dir, case) in cases() {
        let store = Arc::new(LocalStore::new(dir.join("archive")).unwrap());
        let reader =
            ArchiveReader::new(store, case["key_prefix"].as_str().unwrap(), formats(&case))
                .unwrap();
        if let Some(err) = case.get("expect_error").and_then(Value::as_str) {
            let e = reader
                .reconstruct_at(None, &key_fields(&case))
                .await
                .expect_err(&name);
            assert!(
                e.to_string().to_lowercase().contains(&err.to_lowercase()),
                "{name}: error {e:?} lacks {err:?}"
            );
            continue;
        }
        let manifest = reader.load_manifest().await.unwrap();
        assert_eq!(
            manifest.head_position,
            case["head"].as_str().unwrap(),
            "{name}: head"
        );
        assert_eq!(
            manifest.epoch,
            case["epoch"].as_i64().unwrap(),
            "{name}: epoch"
        );
        for q in case["queries"].as_array().unwrap() {
            let at = q["at"].as_str();
            let result = reader.reconstruct_at(at, &key_fields(&case)).await;
            if let Some(err) = q.get("expect_error").and_then(Value::as_str) {
                let e = result.expect_err(&name);
                assert!(
                    e.to_string().to_lowercase().contains(&err.to_lowercase()),
                    "{name} at {at:?}: {e} lacks {err:?}"
                );
                continue;
            }
            let (_, folded) = result.unwrap_or_else(|e| panic!("{name} at {at:?}: {e}"));
            assert_eq!(
                folded.position,
                q["position"].as_str().unwrap(),
                "{name} at {at:?}: position"
            );
            let got: Vec<String> = folded
                .rows
                .values()
                .map(|r| r.as_str().to_string())
                .collect();
            assert_rows_match(
                &format!("{name} at {at:?}"),
                &got,
                q["rows"].as_array().unwrap(),
            );
        }
    }
}
