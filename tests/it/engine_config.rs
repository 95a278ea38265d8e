//! `larch engine` configuration: the documented shape loads; bad configs fail naming the file
//! and the field.

use std::path::PathBuf;
use std::time::Duration;

use larch::archive::format::Format;
use larch::archive::model::TableId;
use larch::archive::store::spec::StoreKind;
use larch::engine::config::{Connection, EngineConfig, TargetConfig};

use crate::cli_archive::larch;

const DOC_EXAMPLE: &str = r#"
sources:
  seed:
    type: archive
    store: {type: s3, bucket: b, prefix: "", region: us-east-1, endpoint: "http://127.0.0.1:8333", path_style: true}
    key_prefix: public.events/
    key_fields: [id]
    format: [jsonl]
    follow: true
    poll_interval: 5s
    state_path: /var/lib/larch/state/seed.pos
    group: false
tables:
  - source: seed
    schema: public
    table: events
    targets:
      - type: memory
        index_fields: [tenant]
      - type: postgres
        connection_file: /etc/larch/target/dsn
        schema: public
        table: events
"#;

#[test]
fn the_documented_shape_loads() {
    let c = EngineConfig::parse("engine.yaml", DOC_EXAMPLE).unwrap();
    assert_eq!(c.sources.len(), 1);
    let s = &c.sources[0];
    assert_eq!(s.id, "seed");
    assert_eq!(s.store.kind, StoreKind::S3);
    assert_eq!(s.store.bucket.as_deref(), Some("b"));
    assert!(s.store.path_style);
    assert_eq!(s.key_prefix, "public.events/");
    assert_eq!(s.key_fields, ["id"]);
    assert_eq!(s.formats, [Format::Jsonl]);
    assert!(s.follow);
    assert_eq!(s.poll_interval, Duration::from_secs(5));
    assert_eq!(
        s.state_path.as_deref(),
        Some(std::path::Path::new("/var/lib/larch/state/seed.pos"))
    );
    assert_eq!(s.table, TableId::new("public", "events"));
    assert_eq!(
        s.targets,
        [
            TargetConfig::Memory {
                index_fields: vec!["tenant".into()]
            },
            TargetConfig::Postgres {
                connection: Connection::File(PathBuf::from("/etc/larch/target/dsn")),
                table: TableId::new("public", "events"),
                split: 1,
            }
        ]
    );
}

#[test]
fn aliases_defaults_and_groups() {
    let c = EngineConfig::parse(
        "engine.yaml",
        r#"
sources:
  g:
    type: file
    store: {type: local, path: /data}
    format: jsonl
    key_fields: id
    state_path: /state
    group: true
  one:
    type: archive
    store: {type: local, path: /data}
tables:
  - {source: g, schema: public, table: a, targets: [{type: memory}]}
  - {source: g, schema: public, table: b, targets: [{type: postgres, connection_env: PG_DSN, table: b_copy, split: 4}]}
  - {source: one, schema: s, table: t, targets: [{type: memory}]}
"#,
    )
    .unwrap();
    let ids: Vec<&str> = c.sources.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["g/public.a", "g/public.b", "one"]);
    let a = &c.sources[0];
    assert_eq!(a.key_prefix, "public.a/");
    assert_eq!(
        a.state_path.as_deref(),
        Some(std::path::Path::new("/state/public.a.pos"))
    );
    assert_eq!(a.key_fields, ["id"]);
    assert_eq!(
        c.sources[1].targets[0],
        TargetConfig::Postgres {
            connection: Connection::Env("PG_DSN".into()),
            table: TableId::new("public", "b_copy"),
            split: 4,
        }
    );
    let one = &c.sources[2];
    assert_eq!(one.key_prefix, "s.t/", "where larch export writes s.t");
    assert_eq!(one.poll_interval, Duration::from_secs(5));
    assert_eq!(one.formats, [Format::Jsonl]);
    assert!(!one.follow && one.state_path.is_none());
}

fn err(yaml: &str) -> String {
    EngineConfig::parse("engine.yaml", yaml)
        .expect_err("invalid config")
        .to_string()
}

const TABLE: &str =
    "tables:\n  - {source: seed, schema: public, table: events, targets: [{type: memory}]}\n";

#[test]
fn bad_configs_name_the_file_and_the_field() {
    let cases: &[(&str, &str)] = &[
        (
            "sources:\n  seed: {type: kafka, store: {type: local, path: /d}}\n",
            r#"engine.yaml: sources.seed.type: unknown source type "kafka" (expected archive or file)"#,
        ),
        (
            "sources:\n  seed: {type: archive}\n",
            "engine.yaml: sources.seed.store: required",
        ),
        (
            "sources:\n  seed: {type: archive, store: {type: local}}\n",
            "engine.yaml: sources.seed.store: type local requires `path`",
        ),
        (
            "sources:\n  seed: {type: archive, store: {type: ftp, path: /d}}\n",
            r#"engine.yaml: sources.seed.store.type: unknown type "ftp" (expected local or s3) at line 2, column 39"#,
        ),
        (
            "sources:\n  seed: {type: archive, store: {type: local, path: /d}, key_prefix: ../up/}\n",
            r#"engine.yaml: sources.seed.key_prefix: "../up/" escapes the store root"#,
        ),
        (
            "sources:\n  seed: {type: archive, store: {type: local, path: /d}, poll_interval: 5 parsecs}\n",
            r#"engine.yaml: sources.seed.poll_interval: duration "5 parsecs": unknown unit " parsecs""#,
        ),
        (
            "sources:\n  seed: {type: archive, store: {type: local, path: /d}, poll_interval: 5}\n",
            "engine.yaml: sources.seed.poll_interval: expected a duration",
        ),
        (
            "sources:\n  seed: {type: archive, store: {type: local, path: /d}, format: [csv]}\n",
            r#"engine.yaml: sources.seed.format: unknown format "csv""#,
        ),
        (
            "sources:\n  seed: {type: archive, store: {type: local, path: /d}, folow: true}\n",
            "engine.yaml: sources.seed.folow: unknown field `folow`, expected one of type, store,",
        ),
    ];
    for (sources, want) in cases {
        let got = err(&format!("{sources}{TABLE}"));
        assert!(got.starts_with(want), "got {got:?}, want {want:?}");
    }
    let src = "sources:\n  seed: {type: archive, store: {type: local, path: /d}}\n";
    let table_cases: &[(&str, &str)] = &[
        (
            "tables:\n  - {source: seed, schema: public, table: events, targets: [{type: redis}]}\n",
            r#"engine.yaml: tables[0].targets[0].type: unknown target type "redis" (expected memory or postgres)"#,
        ),
        (
            "tables:\n  - {source: nope, schema: public, table: events, targets: [{type: memory}]}\n",
            r#"engine.yaml: tables[0].source: unknown source "nope""#,
        ),
        (
            "tables:\n  - {source: seed, schema: public, table: events, targets: [{type: postgres}]}\n",
            "engine.yaml: tables[0].targets[0]: a postgres target needs connection_file or connection_env",
        ),
        (
            "tables:\n  - {source: seed, schema: public, table: events, targets: [{type: memory, connection_env: X}]}\n",
            "engine.yaml: tables[0].targets[0].connection_env: not an option of a memory target",
        ),
        (
            "tables:\n  - {source: seed, schema: public, table: events, targets: [{type: memory, split: 2}]}\n",
            "engine.yaml: tables[0].targets[0].split: not an option of a memory target",
        ),
        (
            "tables:\n  - {source: seed, schema: public, table: events, targets: [{type: postgres, connection_env: X, split: 17}]}\n",
            "engine.yaml: tables[0].targets[0].split: 17 COPY streams; between 1 and 16",
        ),
        (
            "tables:\n  - {source: seed, schema: public, table: events, targets: []}\n",
            "engine.yaml: tables[0].targets: at least one target is required",
        ),
        (
            "tables:\n  - {source: seed, schema: public, table: a, targets: [{type: memory}]}\n  - {source: seed, schema: public, table: b, targets: [{type: memory}]}\n",
            "engine.yaml: sources.seed: serves one table but tables[] asks it for public.a, public.b",
        ),
        (
            "tables: []\n",
            "engine.yaml: sources.seed: no tables[] entry uses this source",
        ),
    ];
    for (tables, want) in table_cases {
        let got = err(&format!("{src}{tables}"));
        assert!(got.starts_with(want), "got {got:?}, want {want:?}");
    }
}

/// A configuration error is one no restart fixes: exit 2, and the reason in
/// `--summary-file` (the operator passes its older name, `--termination-log`).
#[test]
fn the_cli_reports_config_errors_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("engine.yaml");
    std::fs::write(
        &path,
        format!("sources:\n  seed: {{type: kafka, store: {{type: local, path: /d}}}}\n{TABLE}"),
    )
    .unwrap();
    let termination = dir.path().join("termination-log");
    for flag in ["--summary-file", "--termination-log"] {
        let _ = std::fs::remove_file(&termination);
        let out = larch()
            .args(["engine", "--config"])
            .arg(&path)
            .arg(flag)
            .arg(&termination)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag}");
        assert!(termination.exists(), "{flag}");
    }
    let out = larch()
        .args(["engine", "--config"])
        .arg(&path)
        .arg("--summary-file")
        .arg(&termination)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&termination).unwrap()).unwrap();
    assert_eq!(doc["reason"], "InvalidConfig");
    assert!(
        doc["error"]
            .as_str()
            .unwrap()
            .contains("sources.seed.type: unknown source type \"kafka\""),
        "{doc}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}: sources.seed.type: unknown source type \"kafka\"",
            path.display()
        )),
        "{stderr}"
    );
    // laredo's `type: file` is accepted: --check gets past the configuration to the archive,
    // which is not there.
    let archive = dir.path().join("archive");
    std::fs::create_dir(&archive).unwrap();
    std::fs::write(
        &path,
        format!(
            "sources:\n  seed: {{type: file, store: {{type: local, path: \"{}\"}}}}\n{TABLE}",
            archive.display()
        ),
    )
    .unwrap();
    let out = larch()
        .args(["engine", "--check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("table public.events: no archive at key_prefix \"public.events/\""),
        "{out:?}"
    );
}
