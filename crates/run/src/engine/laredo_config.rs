//! laredo's HOCON engine configuration (what `laredo-server --config` reads), for archive (`file`)
//! sources and memory targets, translated into larch's engine configuration (the YAML shape of
//! `docs/engine.md`), which is then validated as YAML is. Keys that would change the data served
//! and larch does not support are refused by name with what to use instead; laredo-server's own
//! operational blocks are ignored with a warning (refused under `--strict-config`);
//! `docs/laredo.md` maps every laredo key and flag.

use serde_json::{Map, Value};

/// Parses HOCON text (substitutions from the environment; includes relative to `base_dir`) into
/// a JSON tree.
pub fn parse_hocon(text: &str, base_dir: Option<&std::path::Path>) -> Result<Value, String> {
    let mut opts = hocon::ParseOptions::defaults();
    if let Some(dir) = base_dir {
        opts = opts.with_base_dir(dir.to_path_buf());
    }
    let config = hocon::parse_string_with_options(text, opts).map_err(|e| e.to_string())?;
    let mut root = Map::new();
    for key in config.keys() {
        if let Some(v) = config.get(key) {
            root.insert(key.to_string(), to_json(v));
        }
    }
    Ok(Value::Object(root))
}

fn to_json(v: &hocon::HoconValue) -> Value {
    use hocon::{HoconValue, ScalarType};
    match v {
        HoconValue::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), to_json(v))).collect())
        }
        HoconValue::Array(items) => Value::Array(items.iter().map(to_json).collect()),
        HoconValue::Scalar(s) => match s.value_type {
            ScalarType::Null => Value::Null,
            ScalarType::Boolean => Value::Bool(s.raw == "true"),
            ScalarType::Number => serde_json::from_str::<serde_json::Number>(&s.raw)
                .map(Value::Number)
                .unwrap_or_else(|_| Value::String(s.raw.clone())),
            _ => Value::String(s.raw.clone()),
        },
        // Unresolved substitutions do not survive a resolving parse.
        _ => Value::Null,
    }
}

/// Why a laredo key has no larch equivalent in the engine, by key.
const PG_SOURCE: &str = "a PostgreSQL source key: larch's engine replays archives only (type = archive or file); export the table with `larch export` (or `larch archive export`) and point an archive source at it";
const KINESIS_SOURCE: &str = "an s3-kinesis source key: larch has no Kinesis source";
const PIPELINE: &str = "pipeline buffering, filters and transforms are not supported by larch's engine (it applies every change of the archive as is)";

const TOP_LEVEL_REFUSED: &[(&str, &str)] = &[
    (
        "snapshot",
        "laredo's engine snapshots are not supported: larch's engine rebuilds from the archive on start (a PostgreSQL target resumes from its checkpoint)",
    ),
    (
        "fanout",
        "replication fan-out is not supported by larch's engine",
    ),
    (
        "health",
        "health endpoints are on `larch engine --listen ADDR` at /health/live and /health/ready",
    ),
    (
        "observability",
        "metrics are at /metrics on `larch engine --listen ADDR`; the log level is LARCH_LOG (logs are JSON on stderr)",
    ),
];

/// laredo-server's own operational blocks: they do not change which rows the engine serves, so
/// larch ignores them with a warning (`--strict-config` refuses them, with the message of
/// `TOP_LEVEL_REFUSED` where it has one).
const TOP_LEVEL_IGNORED: &[(&str, &str)] = &[
    // Engine snapshots only speed up laredo's restart; the rows served come from the source.
    (
        "snapshot",
        "laredo-server's own snapshots of its engine (a faster restart); larch's engine rebuilds from the archive on start and a PostgreSQL target resumes from its checkpoint",
    ),
    // The listener of replication-fanout targets, which are refused on their own.
    (
        "fanout",
        "the listener of laredo-server's replication-fanout targets; larch has no fan-out (such a target is refused)",
    ),
    (
        "health",
        "laredo-server's health listener; larch serves /health/live and /health/ready on `larch engine --listen ADDR`",
    ),
    (
        "observability",
        "laredo-server's metrics and logging settings; larch serves /metrics on `larch engine --listen ADDR` under laredo's metric names, and logs per LARCH_LOG / --log-level",
    ),
    (
        "otel",
        "OpenTelemetry export settings; larch serves Prometheus metrics at /metrics on `larch engine --listen ADDR`",
    ),
];

const SOURCE_KEYS: &[&str] = &[
    "type",
    "store",
    "store_config",
    "format",
    "key_prefix",
    "key_fields",
    "follow",
    "poll_interval",
    "state_path",
    "group",
];
const SOURCE_REFUSED: &[(&str, &str)] = &[
    ("connection", PG_SOURCE),
    ("slot_mode", PG_SOURCE),
    ("slot_name", PG_SOURCE),
    ("always_baseline", PG_SOURCE),
    ("publication", PG_SOURCE),
    ("reconnect", PG_SOURCE),
    ("baseline_bucket", KINESIS_SOURCE),
    ("baseline_format", KINESIS_SOURCE),
    ("stream_arn", KINESIS_SOURCE),
    ("consumer_group", KINESIS_SOURCE),
    ("checkpoint_table", KINESIS_SOURCE),
    ("region", KINESIS_SOURCE),
];
/// laredo's `store_config` keys, then larch's additions (an S3-compatible endpoint, key files).
const STORE_CONFIG_KEYS: &[&str] = &[
    "path",
    "bucket",
    "prefix",
    "region",
    "endpoint",
    "path_style",
    "access_key_id_file",
    "secret_access_key_file",
    "session_token_file",
];
const STORE_CONFIG_REFUSED: &[(&str, &str)] = &[(
    "credentials",
    "inline credentials are not accepted (neither does laredo-server): use the ambient AWS chain, or access_key_id_file and secret_access_key_file",
)];
const TABLE_KEYS: &[&str] = &["source", "schema", "table", "targets"];
// ttl deletes rows: the data served would differ.
const TABLE_REFUSED: &[(&str, &str)] =
    &[("ttl", "row expiry (ttl) is not supported by larch's engine")];
/// `validation` only checks row counts (laredo-server does not even read it); it removes no row.
const TABLE_IGNORED: &[(&str, &str)] = &[(
    "validation",
    "row-count validation is not done by larch's engine (laredo-server does not read this block either); `larch archive verify` checks an archive's record counts and checksums",
)];
// Each of these decides which changes a target keeps: the rows served would differ.
const TARGET_COMMON_REFUSED: &[(&str, &str)] = &[
    ("buffer", PIPELINE),
    ("error_handling", PIPELINE),
    ("filters", PIPELINE),
    ("transforms", PIPELINE),
];

/// A laredo key larch ignores: its path (`observability`, `tables[0].validation`) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ignored {
    pub path: String,
    pub why: &'static str,
}

/// larch's engine configuration (a JSON tree in the YAML's shape) and the keys left out of it.
#[derive(Debug)]
pub struct Translation {
    pub config: Value,
    pub ignored: Vec<Ignored>,
}

/// Translates a laredo HOCON configuration (as a JSON tree) into larch's engine configuration.
/// `strict` refuses the keys larch would otherwise ignore.
pub fn translate(doc: &Value, strict: bool) -> Result<Translation, String> {
    let mut keys = Keys {
        strict,
        ignored: Vec::new(),
    };
    let root = object(doc, "the configuration")?;
    keys.check(
        "",
        root,
        &["sources", "tables", "grpc"],
        TOP_LEVEL_REFUSED,
        TOP_LEVEL_IGNORED,
    )?;
    let mut sources = Map::new();
    if let Some(s) = root.get("sources") {
        for (id, source) in object(s, "sources")? {
            let path = format!("sources.{id}");
            sources.insert(id.clone(), translate_source(&path, source)?);
        }
    }
    let mut tables = Vec::new();
    if let Some(t) = root.get("tables") {
        let Value::Array(items) = t else {
            return Err("tables: expected a list of table blocks ([{ source = …, schema = …, table = …, targets = [...] }])".into());
        };
        for (i, table) in items.iter().enumerate() {
            tables.push(translate_table(&mut keys, &format!("tables[{i}]"), table)?);
        }
    }
    let mut config = serde_json::json!({"sources": sources, "tables": tables});
    if let Some(g) = root.get("grpc") {
        config["grpc"] = translate_grpc(g)?;
    }
    Ok(Translation {
        config,
        ignored: keys.ignored,
    })
}

/// Logs one warning for each ignored key of `file` not yet warned about by this process (a
/// configuration loaded twice warns once); returns how many it logged.
pub fn warn_ignored(file: &str, ignored: &[Ignored]) -> usize {
    static WARNED: std::sync::Mutex<std::collections::BTreeSet<(String, String)>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut warned = WARNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut logged = 0;
    for key in ignored {
        if warned.insert((file.to_string(), key.path.clone())) {
            tracing::warn!(
                file,
                key = %key.path,
                "{file}: {}: ignored: {} (--strict-config refuses it)",
                key.path,
                key.why
            );
            logged += 1;
        }
    }
    logged
}

/// `grpc { port = N, tls { cert_file, key_file } }`: laredo's API on every interface's port N,
/// as laredo-server listens (`:N`); `tls` is larch's addition.
fn translate_grpc(grpc: &Value) -> Result<Value, String> {
    let obj = object(grpc, "grpc")?;
    check_keys("grpc", obj, &["port", "tls"], &[])?;
    let port = obj
        .get("port")
        .and_then(Value::as_u64)
        .filter(|p| (1..=65535).contains(p))
        .ok_or_else(|| "grpc.port: expected a port number from 1 to 65535".to_string())?;
    let mut out = serde_json::json!({"listen": format!("0.0.0.0:{port}")});
    if let Some(tls) = obj.get("tls") {
        let t = object(tls, "grpc.tls")?;
        check_keys("grpc.tls", t, &["cert_file", "key_file"], &[])?;
        out["tls"] = tls.clone();
    }
    Ok(out)
}

fn translate_source(path: &str, source: &Value) -> Result<Value, String> {
    let obj = object(source, path)?;
    match obj.get("type").and_then(Value::as_str) {
        Some("archive" | "file") => {}
        Some(t @ ("postgresql" | "pg")) => {
            return Err(format!("{path}.type: {t:?} is {PG_SOURCE}"));
        }
        Some(t @ "s3-kinesis") => return Err(format!("{path}.type: {t:?} is {KINESIS_SOURCE}")),
        // larch's own validation names the missing or unknown type
        _ => {}
    }
    check_keys(path, obj, SOURCE_KEYS, SOURCE_REFUSED)?;
    let mut out = Map::new();
    // laredo-server reads a root-level manifest.json without key_prefix (larch's YAML
    // defaults to <schema>.<table>/); a group forces its own.
    if !obj.contains_key("key_prefix") && obj.get("group") != Some(&Value::Bool(true)) {
        out.insert("key_prefix".into(), Value::String(String::new()));
    }
    for (key, value) in obj {
        match key.as_str() {
            "store" | "store_config" => {}
            _ => {
                out.insert(key.clone(), value.clone());
            }
        }
    }
    match (obj.get("store"), obj.get("store_config")) {
        (None, None) => {}
        (None, Some(_)) => {
            return Err(format!(
                "{path}.store: required with store_config (store = local or store = s3)"
            ));
        }
        (Some(Value::String(kind)), config) => {
            let mut store = Map::new();
            store.insert("type".into(), Value::String(kind.clone()));
            if let Some(config) = config {
                let cpath = format!("{path}.store_config");
                let c = object(config, &cpath)?;
                check_keys(&cpath, c, STORE_CONFIG_KEYS, STORE_CONFIG_REFUSED)?;
                store.extend(c.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            out.insert("store".into(), Value::Object(store));
        }
        (Some(_), _) => {
            return Err(format!(
                "{path}.store: expected local or s3 (laredo's shape: store = local, store_config {{ path = … }})"
            ));
        }
    }
    Ok(Value::Object(out))
}

fn translate_table(keys: &mut Keys, path: &str, table: &Value) -> Result<Value, String> {
    let obj = object(table, path)?;
    keys.check(path, obj, TABLE_KEYS, TABLE_REFUSED, TABLE_IGNORED)?;
    let mut out = obj.clone();
    for (key, _) in TABLE_IGNORED {
        out.remove(*key);
    }
    if let Some(targets) = obj.get("targets") {
        let Value::Array(items) = targets else {
            return Err(format!(
                "{path}.targets: expected a list of targets ([{{ type = indexed-memory }}])"
            ));
        };
        let mut translated = Vec::new();
        for (j, target) in items.iter().enumerate() {
            translated.push(translate_target(&format!("{path}.targets[{j}]"), target)?);
        }
        out.insert("targets".into(), Value::Array(translated));
    }
    Ok(Value::Object(out))
}

fn translate_target(path: &str, target: &Value) -> Result<Value, String> {
    let obj = object(target, path)?;
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or("");
    let (allowed, renames): (&[&str], &[(&str, &str)]) = match kind {
        "indexed-memory" => (
            &["type", "lookup_fields"],
            &[("type", "type"), ("lookup_fields", "index_fields")],
        ),
        // larch's own target types, in HOCON syntax
        "memory" => (&["type", "index_fields"], &[]),
        "postgres" => (
            &[
                "type",
                "connection_file",
                "connection_env",
                "schema",
                "table",
            ],
            &[],
        ),
        "compiled-memory" | "http-sync" | "replication-fanout" => {
            return Err(format!(
                "{path}.type: {kind:?} is not supported by larch's engine (targets: indexed-memory, or larch's memory and postgres)"
            ));
        }
        // larch's own validation names the missing or unknown type
        _ => return Ok(target.clone()),
    };
    let mut refused: Vec<(&str, &str)> = TARGET_COMMON_REFUSED.to_vec();
    if kind == "indexed-memory" {
        refused.push((
            "additional_indexes",
            "named indexes are not supported: larch's memory target filters rows by equality on the lookup_fields (GET /tables/{table}/rows?field=value)",
        ));
    }
    check_keys(path, obj, allowed, &refused)?;
    let mut out = Map::new();
    for (key, value) in obj {
        let name = renames
            .iter()
            .find(|(from, _)| from == key)
            .map_or(key.as_str(), |(_, to)| to);
        out.insert(name.to_string(), value.clone());
    }
    if kind == "indexed-memory" {
        out.insert("type".into(), Value::String("memory".into()));
    }
    Ok(Value::Object(out))
}

fn object<'a>(v: &'a Value, path: &str) -> Result<&'a Map<String, Value>, String> {
    v.as_object()
        .ok_or_else(|| format!("{path}: expected an object ({{ … }})"))
}

/// Refuses every key of `obj` that is not `allowed`, naming it and saying why.
fn check_keys(
    path: &str,
    obj: &Map<String, Value>,
    allowed: &[&str],
    refused: &[(&str, &str)],
) -> Result<(), String> {
    Keys {
        strict: true,
        ignored: Vec::new(),
    }
    .check(path, obj, allowed, refused, &[])
}

/// The keys ignored so far, and whether ignoring is allowed at all.
struct Keys {
    strict: bool,
    ignored: Vec<Ignored>,
}

impl Keys {
    /// Refuses every key of `obj` that is neither `allowed` nor (unless strict) `ignorable`,
    /// naming it and saying why; records the ignored ones. `path` is "" at the root.
    fn check(
        &mut self,
        path: &str,
        obj: &Map<String, Value>,
        allowed: &[&str],
        refused: &[(&str, &str)],
        ignorable: &[(&str, &'static str)],
    ) -> Result<(), String> {
        for key in obj.keys() {
            if allowed.contains(&key.as_str()) {
                continue;
            }
            let key_path = match path {
                "" => key.clone(),
                _ => format!("{path}.{key}"),
            };
            let Some((_, why)) = ignorable.iter().find(|(k, _)| k == key) else {
                return Err(refusal(&key_path, key, refused, &allowed.join(", ")));
            };
            if self.strict {
                let reasons: Vec<(&str, &str)> = refused.iter().chain(ignorable).copied().collect();
                let refusal = refusal(&key_path, key, &reasons, &allowed.join(", "));
                return Err(format!(
                    "{refusal} (refused by --strict-config; without it larch ignores this key with a warning)"
                ));
            }
            self.ignored.push(Ignored {
                path: key_path,
                why,
            });
        }
        Ok(())
    }
}

fn refusal(path: &str, key: &str, refused: &[(&str, &str)], allowed: &str) -> String {
    match refused.iter().find(|(k, _)| *k == key) {
        Some((_, why)) => format!("{path}: not supported: {why}"),
        None => format!("{path}: unknown key (expected one of: {allowed})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tr(text: &str) -> Result<Value, String> {
        Ok(translate(&parse_hocon(text, None)?, false)?.config)
    }

    /// docs/laredo.md names every key this translation knows, accepted or refused.
    #[test]
    fn the_mapping_doc_names_every_key() {
        let doc = include_str!("../../../../docs/laredo.md");
        let refused = [
            SOURCE_REFUSED,
            STORE_CONFIG_REFUSED,
            TABLE_REFUSED,
            TARGET_COMMON_REFUSED,
            TOP_LEVEL_REFUSED,
            TOP_LEVEL_IGNORED,
            TABLE_IGNORED,
        ];
        let keys = SOURCE_KEYS
            .iter()
            .chain(STORE_CONFIG_KEYS)
            .chain(TABLE_KEYS)
            .copied()
            .chain(refused.iter().flat_map(|r| r.iter().map(|(k, _)| *k)))
            .chain(["indexed-memory", "lookup_fields", "additional_indexes"])
            .chain(["compiled-memory", "http-sync", "replication-fanout"]);
        for key in keys {
            assert!(
                doc.contains(&format!("`{key}"))
                    || doc.contains(&format!("{key}`"))
                    || doc.contains(&format!("{key},"))
                    || doc.contains(&format!(" {key} ")),
                "docs/laredo.md does not mention {key}"
            );
        }
    }

    #[test]
    fn hocon_values_become_json() {
        let v = parse_hocon(
            "a { b = 1, c = [x, \"y z\"], d = true, e = null, f = 5s, \"g.h\" = 1.50 }",
            None,
        )
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"a": {"b": 1, "c": ["x", "y z"], "d": true, "e": null, "f": "5s", "g.h": 1.50}})
        );
    }

    #[test]
    fn renames_laredo_keys_and_refuses_the_rest_by_name() {
        let v = tr(
            r#"sources { s { type = file, store = local, store_config { path = "/a" } } }
            tables = [{ source = s, schema = public, table = t,
                        targets = [{ type = indexed-memory, lookup_fields = [tenant] }] }]"#,
        )
        .unwrap();
        assert_eq!(
            v["sources"]["s"]["store"],
            serde_json::json!({"type": "local", "path": "/a"})
        );
        assert_eq!(
            v["tables"][0]["targets"][0],
            serde_json::json!({"type": "memory", "index_fields": ["tenant"]})
        );
        for (text, want) in [
            (
                "sources { s { type = archive, connection = x } }",
                "sources.s.connection: not supported: a PostgreSQL source key",
            ),
            (
                "sources { s { type = postgresql } }",
                "sources.s.type: \"postgresql\" is a PostgreSQL source key",
            ),
            (
                "sources { s { type = archive, store = s3, store_config { credentials = k } } }",
                "sources.s.store_config.credentials: not supported: inline credentials",
            ),
            (
                "sources { s { type = archive, colour = red } }",
                "sources.s.colour: unknown key (expected one of: type, store,",
            ),
            (
                "grpc { port = 0 }",
                "grpc.port: expected a port number from 1 to 65535",
            ),
            (
                "tables = [{ source = s, ttl { field = x } }]",
                "tables[0].ttl: not supported",
            ),
            (
                "tables = [{ targets = [{ type = indexed-memory, buffer { max_size = 1 } }] }]",
                "tables[0].targets[0].buffer: not supported: pipeline buffering",
            ),
            (
                "tables = [{ targets = [{ type = indexed-memory, additional_indexes = [] }] }]",
                "tables[0].targets[0].additional_indexes: not supported: named indexes",
            ),
            (
                "tables = [{ targets = [{ type = http-sync }] }]",
                "tables[0].targets[0].type: \"http-sync\" is not supported",
            ),
            (
                "sources { s { type = archive, store_config { path = x } } }",
                "sources.s.store: required with store_config",
            ),
        ] {
            let err = tr(text).unwrap_err();
            assert!(err.starts_with(want), "{text}: {err}");
        }
    }

    #[test]
    fn the_grpc_block_is_the_grpc_listener() {
        let v = tr(r#"grpc { port = 4001, tls { cert_file = "/c.pem", key_file = "/k.pem" } }"#)
            .unwrap();
        assert_eq!(
            v["grpc"],
            serde_json::json!({"listen": "0.0.0.0:4001",
                "tls": {"cert_file": "/c.pem", "key_file": "/k.pem"}})
        );
        let e = tr("grpc { port = 4001, reflection = true }").unwrap_err();
        assert!(e.starts_with("grpc.reflection: unknown key"), "{e}");
    }

    /// laredo's e2e server config shape with laredo-server's own blocks, on an archive source.
    const SERVER_BLOCKS: &str = r#"
        sources { s { type = file, store = local, store_config { path = "/a" } } }
        tables = [{ source = s, schema = public, table = t,
                    targets = [{ type = indexed-memory, lookup_fields = [name] }],
                    validation { post_baseline_row_count = true, on_mismatch = warn } }]
        fanout { grpc { port = 4002 } }
        health { http_port = 8080, readiness_path = "/health/ready" }
        observability { metrics { type = prometheus, port = 9090 }, logging { level = info } }
        otel { endpoint = "http://collector:4317" }
        snapshot { enabled = true, store = local, schedule = "every 6h" }
    "#;

    #[test]
    fn server_only_blocks_are_ignored_and_listed() {
        let got = translate(&parse_hocon(SERVER_BLOCKS, None).unwrap(), false).unwrap();
        let paths: Vec<&str> = got.ignored.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "fanout",
                "health",
                "observability",
                "otel",
                "snapshot",
                "tables[0].validation"
            ]
        );
        assert!(
            got.ignored[0].why.contains("replication-fanout"),
            "{:?}",
            got.ignored[0]
        );
        // the same engine as without them
        let bare = tr(
            r#"sources { s { type = file, store = local, store_config { path = "/a" } } }
            tables = [{ source = s, schema = public, table = t,
                        targets = [{ type = indexed-memory, lookup_fields = [name] }] }]"#,
        )
        .unwrap();
        assert_eq!(got.config, bare);
    }

    #[test]
    fn strict_config_refuses_what_would_be_ignored_and_the_rest_stays_refused() {
        let doc = parse_hocon(SERVER_BLOCKS, None).unwrap();
        let err = translate(&doc, true).unwrap_err();
        assert_eq!(
            err,
            "fanout: not supported: replication fan-out is not supported by larch's engine (refused by --strict-config; without it larch ignores this key with a warning)"
        );
        let validation = "sources { s { type = file } }\ntables = [{ source = s, validation { on_mismatch = warn } }]";
        let err = translate(&parse_hocon(validation, None).unwrap(), true).unwrap_err();
        assert!(
            err.starts_with("tables[0].validation: not supported: row-count validation")
                && err.ends_with(
                    "(refused by --strict-config; without it larch ignores this key with a warning)"
                ),
            "{err}"
        );
        // keys that change the rows served are refused either way
        for text in [
            "tables = [{ source = s, ttl { field = x } }]",
            "tables = [{ targets = [{ type = indexed-memory, transforms = [] }] }]",
        ] {
            let doc = parse_hocon(text, None).unwrap();
            assert!(translate(&doc, false).is_err(), "{text}");
        }
    }

    /// A writer the test reads back, for the warnings.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn each_ignored_key_is_warned_about_once() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let ignored = translate(&parse_hocon(SERVER_BLOCKS, None).unwrap(), false)
            .unwrap()
            .ignored;
        let logged = tracing::subscriber::with_default(subscriber, || {
            [
                warn_ignored("warn-once.conf", &ignored),
                warn_ignored("warn-once.conf", &ignored),
            ]
        });
        assert_eq!(logged, [6, 0]);
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        for key in &ignored {
            let line = format!("warn-once.conf: {}: ignored: ", key.path);
            assert_eq!(text.matches(&line).count(), 1, "{line} in\n{text}");
        }
        assert!(text.contains("WARN"), "{text}");
        assert!(
            text.contains("observability: ignored: laredo-server's metrics and logging settings"),
            "{text}"
        );
    }
}
