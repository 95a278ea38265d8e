//! `larch engine` configuration: YAML, or laredo's HOCON (`laredo_config`), validated at load
//! time. Every error names the file and the field path
//! (`engine.yaml: sources.seed.type: unknown source type "kafka" ...`).
//! The shape is documented in `docs/engine.md` and relied upon by the operator.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use larch_core::failure::{Classify, Reason};
use thiserror::Error;

use larch_archive::format::Format;
use larch_archive::model::TableId;
use larch_archive::point_in_time::PointInTime;
use larch_archive::store::check_key_prefix;
use larch_archive::store::spec::StoreSpec;
use larch_contract::engine_file::{
    EngineFile, OneOrMany, SourceFile, SourceKind, TargetFile, TargetKind,
};

#[derive(Debug, Error)]
#[error("{file}: {message}")]
pub struct ConfigError {
    pub file: String,
    pub message: String,
}

impl Classify for ConfigError {
    fn reason(&self) -> Option<Reason> {
        Some(Reason::InvalidConfig)
    }
}

/// Where a PostgreSQL target finds its connection string (never inline in the config).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Connection {
    File(PathBuf),
    Env(String),
}

impl Connection {
    /// Reads the connection string.
    pub fn resolve(&self) -> anyhow::Result<String> {
        match self {
            Connection::File(p) => Ok(std::fs::read_to_string(p)
                .map_err(|e| anyhow::anyhow!("connection_file {}: {e}", p.display()))?
                .trim()
                .to_string()),
            Connection::Env(v) => std::env::var(v).map_err(|_| {
                anyhow::anyhow!("connection_env: environment variable {v} is not set")
            }),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetConfig {
    Memory {
        index_fields: Vec<String>,
    },
    Postgres {
        connection: Connection,
        /// Destination table.
        table: TableId,
        /// COPY streams a baseline loads over (1: one, inside the baseline's transaction).
        split: u16,
    },
}

impl TargetConfig {
    pub fn kind(&self) -> &'static str {
        match self {
            TargetConfig::Memory { .. } => "memory",
            TargetConfig::Postgres { .. } => "postgres",
        }
    }
}

/// One archive source serving one table (group blocks are expanded into one per table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceConfig {
    /// `seed`, or `<group>/<schema>.<table>` for a group member.
    pub id: String,
    pub store: StoreSpec,
    pub key_prefix: String,
    pub key_fields: Vec<String>,
    pub formats: Vec<Format>,
    pub follow: bool,
    /// Serve the table as it was at this point (a position or an RFC 3339 time); never with
    /// `follow`.
    pub at: Option<PointInTime>,
    pub poll_interval: Duration,
    pub state_path: Option<PathBuf>,
    pub table: TableId,
    pub targets: Vec<TargetConfig>,
    /// Refuse an archive whose manifest records no masking transform.
    pub require_transformed: bool,
    /// Also refuse one without a passed leak check at its head.
    pub require_leak_check: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    pub file: String,
    pub sources: Vec<SourceConfig>,
    /// laredo's gRPC API: its listener and TLS files (`grpc` in the file).
    pub grpc: Option<GrpcConfig>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcConfig {
    pub listen: String,
    pub tls: Option<super::tls::TlsFiles>,
}

/// The syntax of an engine configuration file, by its name: laredo's HOCON for `.conf` and
/// `.hocon`, larch's YAML otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syntax {
    Yaml,
    LaredoHocon,
}

impl Syntax {
    pub fn of(path: &Path) -> Syntax {
        match path.extension().and_then(|e| e.to_str()) {
            Some("conf" | "hocon") => Syntax::LaredoHocon,
            _ => Syntax::Yaml,
        }
    }
}

impl EngineConfig {
    pub fn load(path: &Path) -> Result<EngineConfig, ConfigError> {
        EngineConfig::load_with(path, false)
    }

    /// `load`; `strict_config` refuses the laredo keys larch would ignore with a warning.
    pub fn load_with(path: &Path, strict_config: bool) -> Result<EngineConfig, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            message: format!("cannot read: {e}"),
        })?;
        match Syntax::of(path) {
            Syntax::Yaml => EngineConfig::parse(&file, &text),
            Syntax::LaredoHocon => {
                EngineConfig::parse_hocon_with(&file, &text, path.parent(), strict_config)
            }
        }
    }

    /// Parses and validates YAML text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<EngineConfig, ConfigError> {
        let raw: EngineFile = larch_contract::from_yaml(text).map_err(|message| ConfigError {
            file: file.to_string(),
            message,
        })?;
        EngineConfig::from_raw(file, raw)
    }

    /// Parses laredo's HOCON (archive sources, memory targets; see `laredo_config`), then
    /// validates it as YAML is. `base_dir` resolves `include`s. laredo-server's own blocks are
    /// ignored with a warning.
    pub fn parse_hocon(
        file: &str,
        text: &str,
        base_dir: Option<&Path>,
    ) -> Result<EngineConfig, ConfigError> {
        EngineConfig::parse_hocon_with(file, text, base_dir, false)
    }

    /// `parse_hocon`; `strict_config` refuses the keys it would ignore.
    pub fn parse_hocon_with(
        file: &str,
        text: &str,
        base_dir: Option<&Path>,
        strict_config: bool,
    ) -> Result<EngineConfig, ConfigError> {
        let err = |message: String| ConfigError {
            file: file.to_string(),
            message,
        };
        let doc = super::laredo_config::parse_hocon(text, base_dir).map_err(err)?;
        let translation = super::laredo_config::translate(&doc, strict_config).map_err(err)?;
        let larch = translation.config;
        // serde_json names no path of its own; YAML's errors start with one
        let raw: EngineFile = serde_path_to_error::deserialize(larch).map_err(|e| {
            match e.path().to_string().as_str() {
                "." => err(e.inner().to_string()),
                path => err(format!("{path}: {}", e.inner())),
            }
        })?;
        let config = EngineConfig::from_raw(file, raw)?;
        // Only a configuration that loads warns, so a refused one prints its error alone.
        super::laredo_config::warn_ignored(file, &translation.ignored);
        Ok(config)
    }

    fn from_raw(file: &str, raw: EngineFile) -> Result<EngineConfig, ConfigError> {
        let mut config = validate(raw).map_err(|message| ConfigError {
            file: file.to_string(),
            message,
        })?;
        config.file = file.to_string();
        Ok(config)
    }
}

/// Which tables each source serves (by source id), with their targets.
type Served<'a> = BTreeMap<&'a str, BTreeMap<TableId, Vec<TargetConfig>>>;

fn validate(raw: EngineFile) -> Result<EngineConfig, String> {
    // Tables first: which (schema, table) each source serves, and their targets.
    let mut served = validate_tables(&raw)?;
    if raw.sources.is_empty() {
        return Err(
            "sources: at least one source is required (an engine without one serves nothing, yet would report ready)"
                .into(),
        );
    }
    let mut sources = Vec::new();
    for (id, s) in &raw.sources {
        let path = format!("sources.{id}");
        let settings = validate_source(&path, id, s)?;
        let Some(tables) = served.remove(id.as_str()) else {
            return Err(format!(
                "{path}: no tables[] entry uses this source (add one with source: {id})"
            ));
        };
        if !s.group && tables.len() > 1 {
            return Err(format!(
                "{path}: serves one table but tables[] asks it for {} (use group: true for one source per table)",
                tables
                    .keys()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for (table, targets) in tables {
            sources.push(settings.for_table(id, s, table, targets));
        }
    }
    let grpc = raw.grpc.as_ref().map(validate_grpc).transpose()?;
    Ok(EngineConfig {
        file: String::new(),
        sources,
        grpc,
    })
}

fn validate_grpc(g: &larch_contract::engine_file::GrpcFile) -> Result<GrpcConfig, String> {
    let port = g.listen.rsplit_once(':').map(|(_, p)| p.parse::<u16>());
    if !matches!(port, Some(Ok(_))) {
        return Err(format!(
            "grpc.listen: expected HOST:PORT (e.g. 0.0.0.0:4001), got {:?}",
            g.listen
        ));
    }
    Ok(GrpcConfig {
        listen: g.listen.clone(),
        tls: g.tls.as_ref().map(|t| super::tls::TlsFiles {
            cert: t.cert_file.clone(),
            key: t.key_file.clone(),
        }),
    })
}

/// The `tables[]` entries, checked, grouped by source and table (one memory target a table).
fn validate_tables(raw: &EngineFile) -> Result<Served<'_>, String> {
    let mut served: Served<'_> = BTreeMap::new();
    let mut memory_tables: BTreeMap<TableId, String> = BTreeMap::new();
    for (i, t) in raw.tables.iter().enumerate() {
        let path = format!("tables[{i}]");
        if t.source.is_empty() {
            return Err(format!("{path}.source: required"));
        }
        if !raw.sources.contains_key(&t.source) {
            return Err(format!(
                "{path}.source: unknown source {:?} (defined: {})",
                t.source,
                raw.sources.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        for (field, v) in [("schema", &t.schema), ("table", &t.table)] {
            if v.is_empty() {
                return Err(format!("{path}.{field}: required"));
            }
            if !TableId::is_valid_part(v) {
                return Err(format!("{path}.{field}: {v:?} is not a valid name"));
            }
        }
        let table = TableId::new(&t.schema, &t.table);
        if t.targets.is_empty() {
            return Err(format!("{path}.targets: at least one target is required"));
        }
        let mut targets = Vec::new();
        for (j, tg) in t.targets.iter().enumerate() {
            let tpath = format!("{path}.targets[{j}]");
            let target = validate_target(&tpath, tg, &table)?;
            if let TargetConfig::Memory { .. } = target
                && let Some(prev) = memory_tables.insert(table.clone(), tpath.clone())
            {
                return Err(format!(
                    "{tpath}: table {table} already has a memory target ({prev}); the HTTP API serves one per table"
                ));
            }
            targets.push(target);
        }
        served
            .entry(t.source.as_str())
            .or_default()
            .entry(table)
            .or_default()
            .extend(targets);
    }
    Ok(served)
}

/// A source's settings, checked once and shared by every table it serves.
struct SourceSettings {
    store: StoreSpec,
    /// `None`: `<schema>.<table>/`, where `larch export` writes the table.
    key_prefix: Option<String>,
    key_fields: Vec<String>,
    formats: Vec<Format>,
    at: Option<PointInTime>,
    poll_interval: Duration,
}

impl SourceSettings {
    /// The source of `table`: with `group: true`, one source a table (`<id>/<table>`,
    /// reading `<table>/`, its own state file).
    fn for_table(
        &self,
        id: &str,
        s: &SourceFile,
        table: TableId,
        targets: Vec<TargetConfig>,
    ) -> SourceConfig {
        let (sid, prefix, state_path) = if s.group {
            (
                format!("{id}/{table}"),
                format!("{table}/"),
                s.state_path
                    .as_ref()
                    .map(|d| d.join(format!("{table}.pos"))),
            )
        } else {
            (
                id.to_string(),
                self.key_prefix
                    .clone()
                    .unwrap_or_else(|| format!("{table}/")),
                s.state_path.clone(),
            )
        };
        SourceConfig {
            id: sid,
            store: self.store.clone(),
            key_prefix: prefix,
            key_fields: self.key_fields.clone(),
            formats: self.formats.clone(),
            follow: s.follow,
            at: self.at,
            poll_interval: self.poll_interval,
            state_path,
            table,
            targets,
            require_transformed: s.require_transformed,
            require_leak_check: s.require_leak_check,
        }
    }
}

/// Checks `sources.<id>` (`path`): its id, type, store and key prefix, then how it reads.
fn validate_source(path: &str, id: &str, s: &SourceFile) -> Result<SourceSettings, String> {
    if id.is_empty() || id.contains('/') {
        return Err(format!("{path}: a source id must be non-empty without '/'"));
    }
    match &s.kind {
        Some(SourceKind::Archive | SourceKind::File) => {}
        Some(SourceKind::Unknown(other)) if !other.is_empty() => {
            return Err(format!(
                "{path}.type: unknown source type {other:?} (expected archive or file)"
            ));
        }
        None | Some(SourceKind::Unknown(_)) => {
            return Err(format!("{path}.type: required (archive or file)"));
        }
    }
    let Some(store) = &s.store else {
        return Err(format!(
            "{path}.store: required (an archive source needs a store: {{type: local, path: DIR}} or {{type: s3, bucket: B}})"
        ));
    };
    store.validate().map_err(|e| format!("{path}.{e}"))?;
    if s.group && s.key_prefix.is_some() {
        return Err(format!(
            "{path}.key_prefix: not allowed with group: true (each table reads <schema>.<table>/)"
        ));
    }
    if let Some(key_prefix) = &s.key_prefix {
        check_key_prefix(key_prefix)
            .map_err(|_| format!("{path}.key_prefix: {key_prefix:?} escapes the store root"))?;
        if !key_prefix.is_empty() && !key_prefix.ends_with('/') {
            return Err(format!(
                "{path}.key_prefix: {key_prefix:?} must end with '/' (the manifest is at <key_prefix>manifest.json)"
            ));
        }
    }
    let key_fields: Vec<String> = s
        .key_fields
        .clone()
        .map(OneOrMany::into_vec)
        .unwrap_or_default();
    if key_fields.iter().any(|k| k.is_empty()) {
        return Err(format!("{path}.key_fields: empty field name"));
    }
    Ok(SourceSettings {
        store: store.clone(),
        key_prefix: s.key_prefix.clone(),
        key_fields,
        formats: source_formats(path, s)?,
        at: source_at(path, s)?,
        poll_interval: source_poll_interval(path, s)?,
    })
}

fn source_formats(path: &str, s: &SourceFile) -> Result<Vec<Format>, String> {
    let Some(f) = &s.format else {
        return Ok(vec![Format::Jsonl]);
    };
    let ids = f.clone().into_vec();
    if ids.is_empty() {
        return Err(format!("{path}.format: at least one format is required"));
    }
    ids.iter()
        .map(|id| Format::parse(id).map_err(|e| format!("{path}.format: {e}")))
        .collect()
}

/// The point in time a source is pinned at; a pinned source cannot follow.
fn source_at(path: &str, s: &SourceFile) -> Result<Option<PointInTime>, String> {
    let at = match &s.at {
        None => None,
        Some(text) => Some(
            text.parse::<PointInTime>()
                .map_err(|e| format!("{path}.at: {e}"))?,
        ),
    };
    if at.is_some() && s.follow {
        return Err(format!(
            "{path}.at: a source pinned at a point in time does not follow the archive: remove follow: true (or at)"
        ));
    }
    Ok(at)
}

fn source_poll_interval(path: &str, s: &SourceFile) -> Result<Duration, String> {
    match &s.poll_interval {
        None => Ok(Duration::from_secs(5)),
        Some(serde_json::Value::String(t)) => larch_core::duration::parse_positive(t)
            .map_err(|e| format!("{path}.poll_interval: {e}")),
        Some(other) => Err(format!(
            "{path}.poll_interval: expected a duration such as \"5s\", found {}",
            serde_json::to_string(other).unwrap_or_default()
        )),
    }
}

fn validate_target(path: &str, t: &TargetFile, table: &TableId) -> Result<TargetConfig, String> {
    match &t.kind {
        Some(TargetKind::Memory) => {
            for (field, set) in [
                ("connection_file", t.connection_file.is_some()),
                ("connection_env", t.connection_env.is_some()),
                ("schema", t.schema.is_some()),
                ("table", t.table.is_some()),
                ("split", t.split.is_some()),
            ] {
                if set {
                    return Err(format!(
                        "{path}.{field}: not an option of a memory target (it serves the source table)"
                    ));
                }
            }
            let index_fields = t.index_fields.clone().unwrap_or_default();
            if index_fields.iter().any(|f| f.is_empty()) {
                return Err(format!("{path}.index_fields: empty field name"));
            }
            Ok(TargetConfig::Memory { index_fields })
        }
        Some(TargetKind::Postgres) => {
            if t.index_fields.is_some() {
                return Err(format!(
                    "{path}.index_fields: only memory targets have index_fields"
                ));
            }
            let connection = match (&t.connection_file, &t.connection_env) {
                (Some(f), None) => Connection::File(f.clone()),
                (None, Some(v)) if !v.is_empty() => Connection::Env(v.clone()),
                (None, _) => {
                    return Err(format!(
                        "{path}: a postgres target needs connection_file or connection_env"
                    ));
                }
                (Some(_), Some(_)) => {
                    return Err(format!(
                        "{path}: connection_file and connection_env are mutually exclusive"
                    ));
                }
            };
            let schema = t.schema.clone().unwrap_or_else(|| table.schema.clone());
            let name = t.table.clone().unwrap_or_else(|| table.table.clone());
            if schema.is_empty() || name.is_empty() {
                return Err(format!(
                    "{path}: destination schema and table must be non-empty"
                ));
            }
            let split = t.split.unwrap_or(1);
            if !(1..=crate::restore::MAX_SPLIT).contains(&split) {
                return Err(format!(
                    "{path}.split: {split} COPY streams; between 1 and {}",
                    crate::restore::MAX_SPLIT
                ));
            }
            Ok(TargetConfig::Postgres {
                connection,
                table: TableId::new(schema, name),
                split,
            })
        }
        Some(TargetKind::Unknown(other)) if !other.is_empty() => Err(format!(
            "{path}.type: unknown target type {other:?} (expected memory or postgres)"
        )),
        None | Some(TargetKind::Unknown(_)) => {
            Err(format!("{path}.type: required (memory or postgres)"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_without_sources_is_refused() {
        for text in [
            "sources: {}\n",
            "sources: {}\ntables: []\n",
            "{}\n",
            "tables: []\n",
        ] {
            let e = EngineConfig::parse("e.yaml", text).unwrap_err().to_string();
            assert!(
                e.starts_with("e.yaml: sources: at least one source is required"),
                "{text:?}: {e}"
            );
        }
    }

    #[test]
    fn at_takes_a_position_or_a_time_and_never_follows() {
        let yaml = |extra: &str| {
            format!(
                "sources:\n  s:\n    type: archive\n    store: {{type: local, path: /tmp/x}}\n    {extra}\ntables:\n  - {{source: s, schema: public, table: t, targets: [{{type: memory}}]}}\n"
            )
        };
        let c = EngineConfig::parse("e.yaml", &yaml("at: 0/16B3748")).unwrap();
        assert_eq!(c.sources[0].at, Some("0/16B3748".parse().unwrap()));
        let c = EngineConfig::parse("e.yaml", &yaml("at: \"2026-11-30T14:00:00Z\"")).unwrap();
        assert_eq!(
            c.sources[0].at,
            Some("2026-11-30T14:00:00Z".parse().unwrap())
        );
        let e = EngineConfig::parse("e.yaml", &yaml("at: noon"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("e.yaml: sources.s.at: \"noon\" is neither a position"),
            "{e}"
        );
        let e = EngineConfig::parse("e.yaml", &yaml("at: 0/10\n    follow: true"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sources.s.at: a source pinned at a point in time does not follow"),
            "{e}"
        );
    }

    #[test]
    fn a_poll_interval_out_of_range_is_refused_by_its_path() {
        let yaml = |interval: &str| {
            format!(
                "sources:\n  s:\n    type: archive\n    store: {{type: local, path: /tmp/x}}\n    poll_interval: \"{interval}\"\ntables:\n  - {{source: s, schema: public, table: t, targets: [{{type: memory}}]}}\n"
            )
        };
        let e = EngineConfig::parse("e.yaml", &yaml("99999999999999999999h")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("e.yaml: sources.s.poll_interval: duration \"99999999999999999999h\" is out of range"),
            "{e}"
        );
        let ok = EngineConfig::parse("e.yaml", &yaml("1h30m")).unwrap();
        assert_eq!(ok.sources[0].poll_interval, Duration::from_secs(5400));
    }

    #[test]
    fn grpc_is_a_listener_and_optional_tls_files() {
        let yaml = |grpc: &str| {
            format!(
                "sources:\n  s:\n    type: archive\n    store: {{type: local, path: /tmp/x}}\ntables:\n  - {{source: s, schema: public, table: t, targets: [{{type: memory}}]}}\n{grpc}"
            )
        };
        assert_eq!(EngineConfig::parse("e.yaml", &yaml("")).unwrap().grpc, None);
        let c = EngineConfig::parse(
            "e.yaml",
            &yaml("grpc: {listen: \"0.0.0.0:4001\", tls: {cert_file: /c.pem, key_file: /k.pem}}"),
        )
        .unwrap();
        let g = c.grpc.unwrap();
        assert_eq!(g.listen, "0.0.0.0:4001");
        assert_eq!(g.tls.unwrap().key, std::path::PathBuf::from("/k.pem"));
        for (grpc, want) in [
            (
                "grpc: {listen: \"4001\"}",
                "e.yaml: grpc.listen: expected HOST:PORT",
            ),
            (
                "grpc: {listen: \"h:x\"}",
                "e.yaml: grpc.listen: expected HOST:PORT",
            ),
            (
                "grpc: {port: 4001}",
                "e.yaml: grpc.port: unknown field `port`",
            ),
        ] {
            let e = EngineConfig::parse("e.yaml", &yaml(grpc))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(want), "{grpc}: {e}");
        }
    }
}
