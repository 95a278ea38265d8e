//! The engine config (`engine.yaml`) of an ArchiveSource, and the dereferenced archive it reads.

use std::collections::BTreeMap;

use serde::Serialize;

use super::pod::{ARCHIVE_DIR, STATE_DIR};
use crate::crd::archive_export::ArchiveExport;
use crate::crd::archive_source::{ArchiveRef, ArchiveSource};
use crate::crd::common::{Format, Location, TableRef};

pub const TARGET_DSN_DIR: &str = "/etc/larch/target";
pub const TARGET_DSN_FILE: &str = "/etc/larch/target/dsn";

/// What an ArchiveSource reads, with `exportRef` resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedArchive {
    pub location: Location,
    /// Claim name of a volume location (an existing claim, or the export's created one).
    pub claim_name: Option<String>,
    pub key_prefix: String,
    pub formats: Option<Vec<Format>>,
    pub tables: Vec<TableRef>,
    pub key_fields: Option<Vec<String>>,
    /// Several tables under one key prefix.
    pub group: bool,
}

/// Resolves the archive of `source`; `export` is the referenced ArchiveExport when `exportRef`
/// is set (`None` if it does not exist). Errors are user-facing messages.
pub fn resolve(
    source: &ArchiveSource,
    export: Option<&ArchiveExport>,
) -> Result<ResolvedArchive, String> {
    let spec = &source.spec;
    let tables_override = spec
        .tables
        .clone()
        .or_else(|| spec.table.clone().map(|t| vec![t]));
    resolve_archive(
        &spec.archive,
        tables_override,
        spec.tables.is_some(),
        spec.key_fields.clone(),
        export,
    )
}

/// Resolves an archive reference (an ArchiveSource's, an ArchiveRestore's): `tables` overrides
/// the export's, `group` says an explicit location holds `<schema>.<table>/` archives.
pub fn resolve_archive(
    archive: &ArchiveRef,
    tables_override: Option<Vec<TableRef>>,
    group_override: bool,
    key_fields: Option<Vec<String>>,
    export: Option<&ArchiveExport>,
) -> Result<ResolvedArchive, String> {
    if let Some(r) = &archive.export_ref {
        let export = export
            .ok_or_else(|| format!("ArchiveExport {} not found in this namespace", r.name))?;
        let e = &export.spec;
        let export_tables = e.source.all_tables();
        let group = e.source.tables.is_some();
        let tables = tables_override.unwrap_or_else(|| export_tables.clone());
        if let Some(t) = tables.iter().find(|t| !export_tables.contains(t)) {
            return Err(format!(
                "table {} is not exported by ArchiveExport {}",
                t.qualified(),
                r.name
            ));
        }
        let key_prefix = if group {
            e.key_prefix.clone().unwrap_or_default()
        } else {
            e.key_prefix
                .clone()
                .or_else(|| {
                    export
                        .status
                        .as_ref()
                        .and_then(|s| s.last_export.as_ref())
                        .and_then(|l| l.key_prefix.clone())
                })
                .unwrap_or_else(|| format!("{}/", tables[0].qualified()))
        };
        let claim_name = e.destination.volume.as_ref().map(|v| {
            v.claim_name
                .clone()
                .unwrap_or_else(|| super::export::archive_claim_name(export))
        });
        return Ok(ResolvedArchive {
            location: e.destination.clone(),
            claim_name,
            key_prefix,
            formats: e.format.map(|f| vec![f]),
            tables,
            key_fields: key_fields.or_else(|| e.source.key_fields.clone()),
            group,
        });
    }
    let location = archive
        .location()
        .ok_or("set archive.exportRef, archive.s3 or archive.volume")?;
    let tables = tables_override.ok_or("with an explicit location, set table or tables")?;
    let group = group_override;
    let key_prefix = match (&archive.key_prefix, group) {
        (Some(kp), _) => kp.clone(),
        (None, true) => String::new(),
        (None, false) => format!("{}/", tables[0].qualified()),
    };
    Ok(ResolvedArchive {
        claim_name: location.volume.as_ref().and_then(|v| v.claim_name.clone()),
        location,
        key_prefix,
        formats: archive.formats.clone(),
        tables,
        key_fields,
        group,
    })
}

#[derive(Serialize, Debug, PartialEq)]
pub struct EngineConfig {
    pub sources: BTreeMap<String, SourceConfig>,
    pub tables: Vec<TableConfig>,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct SourceConfig {
    #[serde(rename = "type")]
    pub type_: &'static str,
    pub store: StoreConfig,
    /// Single table only (a group reads `<schema>.<table>/`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_fields: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<Vec<&'static str>>,
    pub follow: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll_interval: Option<String>,
    pub state_path: String,
    pub group: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub require_transformed: bool,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct StoreConfig {
    #[serde(rename = "type")]
    pub type_: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_style: Option<bool>,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct TableConfig {
    pub source: String,
    pub schema: String,
    pub table: String,
    pub targets: Vec<TargetConfig>,
}

#[derive(Serialize, Debug, PartialEq)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum TargetConfig {
    Memory {
        #[serde(skip_serializing_if = "Option::is_none")]
        index_fields: Option<Vec<String>>,
    },
    Postgres {
        connection_file: String,
        schema: String,
        table: String,
    },
}

/// The engine's source id for an ArchiveSource: its name. Members of a group report as
/// `<name>/<schema>.<table>` in the engine's `/status` and metrics.
pub fn source_id(source: &ArchiveSource) -> String {
    kube::ResourceExt::name_any(source)
}

pub fn engine_config(source: &ArchiveSource, archive: &ResolvedArchive) -> EngineConfig {
    let id = source_id(source);
    // A group reads `<schema>.<table>/` under the store root (the engine allows no key_prefix
    // there), so the group's key prefix moves into the store: the S3 prefix (prepended
    // verbatim, as the exporter does) or a subdirectory of the local store.
    let group_prefix = if archive.group {
        archive.key_prefix.as_str()
    } else {
        ""
    };
    let store = match &archive.location.s3 {
        Some(s3) => StoreConfig {
            type_: "s3",
            path: None,
            bucket: Some(s3.bucket.clone()),
            prefix: Some(format!(
                "{}{group_prefix}",
                s3.prefix.clone().unwrap_or_default()
            )),
            region: s3.region.clone(),
            endpoint: s3.endpoint.clone(),
            path_style: s3.path_style,
        },
        None => StoreConfig {
            type_: "local",
            path: Some(match group_prefix.trim_end_matches('/') {
                "" => ARCHIVE_DIR.to_string(),
                sub => format!("{ARCHIVE_DIR}/{sub}"),
            }),
            bucket: None,
            prefix: None,
            region: None,
            endpoint: None,
            path_style: None,
        },
    };
    let state_path = if archive.group {
        format!("{STATE_DIR}/{id}")
    } else {
        format!("{STATE_DIR}/{id}.pos")
    };
    let spec = &source.spec;
    let src = SourceConfig {
        type_: "archive",
        store,
        key_prefix: (!archive.group).then(|| archive.key_prefix.clone()),
        key_fields: archive.key_fields.clone().filter(|k| !k.is_empty()),
        format: archive
            .formats
            .as_ref()
            .map(|fs| fs.iter().map(|f| f.as_str()).collect()),
        // Pinned at a point in time, the engine never follows.
        follow: spec.at.is_none() && spec.follow.unwrap_or(true),
        at: spec.at.as_ref().and_then(|a| a.value()).map(str::to_string),
        poll_interval: spec.poll_interval.clone(),
        state_path,
        group: archive.group,
        require_transformed: spec.require_transformed.unwrap_or(false),
    };
    let tables = archive
        .tables
        .iter()
        .map(|t| {
            let target = match (&spec.target.memory, &spec.target.postgres) {
                (_, Some(pg)) => TargetConfig::Postgres {
                    connection_file: TARGET_DSN_FILE.into(),
                    schema: pg.schema.clone().unwrap_or_else(|| t.schema().into()),
                    table: match (&pg.table, archive.tables.len()) {
                        (Some(name), 1) => name.clone(),
                        _ => t.name.clone(),
                    },
                },
                (Some(m), None) => TargetConfig::Memory {
                    index_fields: m.index_fields.clone().filter(|f| !f.is_empty()),
                },
                (None, None) => TargetConfig::Memory { index_fields: None },
            };
            TableConfig {
                source: id.clone(),
                schema: t.schema().into(),
                table: t.name.clone(),
                targets: vec![target],
            }
        })
        .collect();
    EngineConfig {
        sources: BTreeMap::from([(id, src)]),
        tables,
    }
}

pub fn engine_yaml(config: &EngineConfig) -> String {
    serde_yaml_ng::to_string(config).expect("engine config serialises")
}
