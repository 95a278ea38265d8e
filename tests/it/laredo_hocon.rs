//! `larch engine --config FILE.conf`: laredo's HOCON, written the way laredo's configuration
//! reference and archive-source guide write it, means the same engine as larch's YAML; keys that
//! would change the data served are refused by name; laredo-server's own blocks are ignored with
//! a warning, or refused under `--strict-config`; the engine serves from such a file.

use std::path::Path;

use larch::engine::config::EngineConfig;

use crate::engine_support::{CliEngine, all_rows, get_json, wait_ready};
use crate::fixtures::cases;

fn hocon(dir: &Path, text: &str) -> Result<EngineConfig, String> {
    let path = dir.join("laredo.conf");
    std::fs::write(&path, text).unwrap();
    EngineConfig::load(&path).map_err(|e| e.to_string())
}

fn yaml(text: &str) -> EngineConfig {
    EngineConfig::parse("engine.yaml", text).unwrap_or_else(|e| panic!("{e}"))
}

/// An archive source as laredo's archive-source guide configures one: a local store with its
/// `store_config`, the prefix, key fields, following with a state file; an indexed-memory target
/// with lookup fields.
#[test]
fn an_archive_source_as_laredo_writes_it_is_the_yaml_engine() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().display();
    let got = hocon(
        dir.path(),
        &format!(
            r#"
# replay one table's archive, keep following it
sources {{
  orders_seed {{
    type = archive                       # or: file
    store = local
    store_config {{ path = "{root}/archive" }}
    format = [jsonl, protobuf]
    key_prefix = "sales.orders/"
    key_fields = [order_id]
    follow = true
    poll_interval = 2s
    state_path = "{root}/orders.ack"
  }}
}}

tables = [
  {{
    source = orders_seed
    schema = sales
    table  = orders
    targets = [{{ type = indexed-memory, lookup_fields = [customer, status] }}]
  }}
]
"#
        ),
    )
    .unwrap();
    let want = yaml(&format!(
        r#"
sources:
  orders_seed:
    type: archive
    store: {{type: local, path: "{root}/archive"}}
    format: [jsonl, protobuf]
    key_prefix: sales.orders/
    key_fields: [order_id]
    follow: true
    poll_interval: 2s
    state_path: "{root}/orders.ack"
tables:
  - source: orders_seed
    schema: sales
    table: orders
    targets:
      - type: memory
        index_fields: [customer, status]
"#
    ));
    assert_eq!(got.sources, want.sources);
    assert_eq!(got.sources[0].poll_interval.as_secs(), 2);
}

/// laredo's `group = true`: one block, one source per table, on one line per table as laredo's
/// configuration reference writes them; and an S3 store (with larch's `endpoint` addition).
#[test]
fn a_group_block_and_an_s3_store_as_laredo_writes_them() {
    let dir = tempfile::tempdir().unwrap();
    let got = hocon(
        dir.path(),
        r#"
sources {
  fleet { type = file, group = true, store = s3
          store_config { bucket = seeds, prefix = "team-a/", region = eu-west-1, endpoint = "http://127.0.0.1:8333", path_style = true }
          format = jsonl, follow = true, state_path = /var/lib/larch/state }
}
tables = [
  { source = fleet, schema = public, table = accounts, targets = [ { type = indexed-memory } ] }
  { source = fleet, schema = billing, table = invoices, targets = [ { type = indexed-memory, lookup_fields = [account] } ] }
]
"#,
    )
    .unwrap();
    let want = yaml(
        r#"
sources:
  fleet:
    type: file
    group: true
    store: {type: s3, bucket: seeds, prefix: team-a/, region: eu-west-1, endpoint: "http://127.0.0.1:8333", path_style: true}
    format: jsonl
    follow: true
    state_path: /var/lib/larch/state
tables:
  - {source: fleet, schema: public, table: accounts, targets: [{type: memory}]}
  - {source: fleet, schema: billing, table: invoices, targets: [{type: memory, index_fields: [account]}]}
"#,
    );
    assert_eq!(got.sources, want.sources);
    let ids: Vec<(&str, &str)> = got
        .sources
        .iter()
        .map(|s| (s.id.as_str(), s.key_prefix.as_str()))
        .collect();
    assert_eq!(
        ids,
        [
            ("fleet/billing.invoices", "billing.invoices/"),
            ("fleet/public.accounts", "public.accounts/")
        ]
    );
}

/// What larch does not do and would change the data served is refused with the key's path.
#[test]
fn unsupported_laredo_keys_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let archive = r#"type = archive, store = local, store_config { path = "/srv/a" }"#;
    let table = "tables = [{ source = s, schema = public, table = t, targets = [{ type = indexed-memory }] }]";
    for (text, want) in [
        // laredo's own server config: a PostgreSQL source, an indexed-memory target, gRPC (served
        // since issue 40: the source is what is refused)
        (
            "sources { pg { type = postgresql, connection = \"postgresql://u@db/app\", slot_mode = ephemeral } }\n\
             tables = [{ source = pg, schema = public, table = users, targets = [{ type = indexed-memory, lookup_fields = [name] }] }]\n\
             grpc { port = 4001 }",
            "sources.pg.type: \"postgresql\" is a PostgreSQL source key",
        ),
        (
            "sources { pg { type = postgresql, connection = \"postgresql://u@db/app\" } }",
            "sources.pg.type: \"postgresql\" is a PostgreSQL source key",
        ),
        (
            &format!("sources {{ s {{ {archive}, slot_name = x }} }}\n{table}"),
            "sources.s.slot_name: not supported: a PostgreSQL source key",
        ),
        (
            &format!(
                "sources {{ s {{ {archive} }} }}\ntables = [{{ source = s, schema = public, table = t, targets = [{{ type = indexed-memory, filters = [{{ type = field-equals, field = f, value = v }}] }}] }}]"
            ),
            "tables[0].targets[0].filters: not supported: pipeline buffering, filters and transforms",
        ),
        (
            &format!(
                "sources {{ s {{ {archive} }} }}\ntables = [{{ source = s, schema = public, table = t, targets = [{{ type = replication-fanout }}] }}]"
            ),
            "tables[0].targets[0].type: \"replication-fanout\" is not supported",
        ),
        (
            &format!(
                "sources {{ s {{ {archive} }} }}\ntables = [{{ source = s, schema = public, table = t, ttl {{ mode = field, field = expires_at }} }}]\nhealth {{ http_port = 8080 }}"
            ),
            "tables[0].ttl: not supported: row expiry (ttl)",
        ),
        (
            &format!(
                "sources {{ s {{ type = archive, store = s3, store_config {{ bucket = b, credentials = secret }} }} }}\n{table}"
            ),
            "sources.s.store_config.credentials: not supported: inline credentials",
        ),
        (
            &format!("sources {{ s {{ {archive}, colour = red }} }}\n{table}"),
            "sources.s.colour: unknown key (expected one of: type, store, store_config, format, key_prefix, key_fields, follow, poll_interval, state_path, group)",
        ),
        // laredo's values larch validates as it does YAML
        (
            &format!("sources {{ s {{ {archive}, poll_interval = 5000 }} }}\n{table}"),
            "sources.s.poll_interval: expected a duration such as \"5s\"",
        ),
        ("sources { s { type = archive, store = local", "ParseError"),
    ] {
        let err = hocon(dir.path(), text).unwrap_err();
        let file = dir.path().join("laredo.conf").display().to_string();
        assert!(
            err.starts_with(&format!("{file}: {want}")),
            "{text}\n got {err}\nwant {want}"
        );
    }
}

/// The engine runs from a HOCON file (an environment substitution in it, as laredo users inject
/// paths and secrets), and serves the archive's rows filtered by a lookup field.
#[tokio::test]
async fn the_engine_serves_from_a_laredo_config() {
    let (_, fixture, case) = cases().into_iter().find(|c| c.0 == "writer-jsonl").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("engine.conf");
    std::fs::write(
        &config,
        r#"
sources {
  seed {
    type = file
    store = local
    store_config { path = ${LARCH_TEST_ARCHIVE} }
    key_prefix = "public.events/"
  }
}
tables = [
  { source = seed, schema = public, table = events,
    targets = [{ type = indexed-memory, lookup_fields = [title] }] }
]
"#,
    )
    .unwrap();
    // --check first: the same validation, no serving
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_larch"))
        .args(["engine", "--check", "--config"])
        .arg(&config)
        .env("LARCH_TEST_ARCHIVE", fixture.join("archive"))
        .output()
        .unwrap();
    assert!(check.status.success(), "{check:?}");
    assert_eq!(
        String::from_utf8_lossy(&check.stdout),
        format!("{}: ok (1 source(s))\n", config.display())
    );

    let archive = fixture.join("archive");
    let engine =
        CliEngine::spawn_with_env(&config, &[("LARCH_TEST_ARCHIVE", archive.as_os_str())]).await;
    wait_ready(engine.addr).await;
    let rows = all_rows(engine.addr, "public.events", 2).await;
    let want: Vec<i64> = [2, 6, 7, 8, 9].into();
    let mut ids: Vec<i64> = rows.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, want, "the head of {}", case["head"]);
    let seven = get_json(engine.addr, "/tables/public.events/rows?title=seven").await;
    assert_eq!(seven["rows"].as_array().unwrap().len(), 1, "{seven}");
    assert_eq!(seven["rows"][0]["id"], 7, "{seven}");
    assert_eq!(engine.stop().await.code(), Some(0));
}

/// laredo's own e2e server config shape (an indexed-memory target with lookup fields), on an
/// archive source, with every laredo-server block larch ignores: `--check` warns once per key,
/// the engine serves, and `--strict-config` exits 2 naming the first such key.
#[tokio::test]
async fn laredo_server_blocks_are_warned_about_and_ignored_unless_strict() {
    let (_, fixture, _) = cases().into_iter().find(|c| c.0 == "writer-jsonl").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("laredo.conf");
    std::fs::write(
        &config,
        r#"
sources {
  seed {
    type = archive
    store = local
    store_config { path = ${LARCH_TEST_ARCHIVE} }
    key_prefix = "public.events/"
  }
}

tables = [
  {
    source = seed
    schema = public
    table = events
    targets = [
      {
        type = indexed-memory
        lookup_fields = [title]
      }
    ]
    validation { post_baseline_row_count = true, on_mismatch = warn }
  }
]

snapshot { enabled = true, store = local, store_config { path = /var/lib/laredo/snapshots }, schedule = "every 6h" }
fanout { grpc { port = 4002 } }
health { http_port = 8080, readiness_path = "/health/ready", liveness_path = "/health/live" }
observability {
  metrics { type = prometheus, port = 9090, path = "/metrics" }
  logging { type = structured, level = info }
}
"#,
    )
    .unwrap();
    let archive = fixture.join("archive");
    let larch = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_larch"))
            .args(["engine", "--check", "--log-format", "text"])
            .args(extra)
            .arg("--config")
            .arg(&config)
            .env("LARCH_TEST_ARCHIVE", &archive)
            .output()
            .unwrap()
    };
    let check = larch(&[]);
    assert!(check.status.success(), "{check:?}");
    let stderr = String::from_utf8_lossy(&check.stderr);
    let file = config.display();
    for key in [
        "fanout",
        "health",
        "observability",
        "snapshot",
        "tables[0].validation",
    ] {
        let warning = format!("{file}: {key}: ignored: ");
        assert_eq!(
            stderr.matches(&warning).count(),
            1,
            "{warning} in\n{stderr}"
        );
    }
    assert_eq!(stderr.matches("WARN").count(), 5, "{stderr}");

    let strict = larch(&["--strict-config"]);
    assert_eq!(strict.status.code(), Some(2), "{strict:?}");
    let stderr = String::from_utf8_lossy(&strict.stderr);
    assert!(
        stderr.contains(&format!(
            "{file}: fanout: not supported: replication fan-out is not supported by larch's engine (refused by --strict-config"
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("ignored"), "{stderr}");

    let engine =
        CliEngine::spawn_with_env(&config, &[("LARCH_TEST_ARCHIVE", archive.as_os_str())]).await;
    wait_ready(engine.addr).await;
    let seven = get_json(engine.addr, "/tables/public.events/rows?title=seven").await;
    assert_eq!(seven["rows"].as_array().unwrap().len(), 1, "{seven}");
    assert_eq!(seven["rows"][0]["id"], 7, "{seven}");
    assert_eq!(engine.stop().await.code(), Some(0));
}
