//! The engine config (`engine.yaml`) of an ArchiveSource, and the dereferenced archive it reads.

use std::collections::BTreeMap;

use larch_archive::store::spec::{StoreKind, StoreSpec};
use larch_contract::engine_file::{
    EngineFile, OneOrMany, SourceFile, SourceKind, TableFile, TargetFile, TargetKind,
};

use super::pod::{ARCHIVE_DIR, STATE_DIR};
use crate::crd::archive_export::ArchiveExport;
use crate::crd::archive_source::{ArchiveRef, ArchiveSource};
use crate::crd::common::{Format, Location, TableRef};

pub use super::pod::{TARGET_DSN_DIR, TARGET_DSN_FILE};

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
                .unwrap_or_else(|| crate::export::build::archive_claim_name(export))
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

/// The engine's source id for an ArchiveSource: its name. Members of a group report as
/// `<name>/<schema>.<table>` in the engine's `/status` and metrics.
pub fn source_id(source: &ArchiveSource) -> String {
    kube::ResourceExt::name_any(source)
}

pub fn engine_config(source: &ArchiveSource, archive: &ResolvedArchive) -> EngineFile {
    let id = source_id(source);
    let state_path = if archive.group {
        format!("{STATE_DIR}/{id}")
    } else {
        format!("{STATE_DIR}/{id}.pos")
    };
    let spec = &source.spec;
    let src = SourceFile {
        kind: Some(SourceKind::Archive),
        store: Some(store_spec(archive)),
        key_prefix: (!archive.group).then(|| archive.key_prefix.clone()),
        key_fields: archive
            .key_fields
            .clone()
            .filter(|k| !k.is_empty())
            .map(OneOrMany::Many),
        format: archive
            .formats
            .as_ref()
            .map(|fs| OneOrMany::Many(fs.iter().map(|f| f.id().to_string()).collect())),
        // Pinned at a point in time, the engine never follows.
        follow: spec.at.is_none() && spec.follow.unwrap_or(true),
        at: spec.at.as_ref().and_then(|a| a.value()).map(str::to_string),
        poll_interval: spec.poll_interval.clone().map(serde_json::Value::String),
        state_path: Some(state_path.into()),
        group: archive.group,
        require_transformed: spec.require_transformed.unwrap_or(false),
        require_leak_check: spec.require_leak_check.unwrap_or(false),
    };
    let tables = archive
        .tables
        .iter()
        .map(|t| TableFile {
            source: id.clone(),
            schema: t.schema().into(),
            table: t.name.clone(),
            targets: vec![target(source, archive, t)],
        })
        .collect();
    EngineFile {
        sources: BTreeMap::from([(id, src)]),
        tables,
        grpc: None,
    }
}

/// Where the engine reads the archive. A group reads `<schema>.<table>/` under the store root
/// (the engine allows no key_prefix there), so the group's key prefix moves into the store: the
/// S3 prefix (prepended verbatim, as the exporter does) or a subdirectory of the local store.
fn store_spec(archive: &ResolvedArchive) -> StoreSpec {
    let group_prefix = if archive.group {
        archive.key_prefix.as_str()
    } else {
        ""
    };
    match &archive.location.s3 {
        Some(s3) => StoreSpec {
            kind: StoreKind::S3,
            bucket: Some(s3.bucket.clone()),
            prefix: Some(format!(
                "{}{group_prefix}",
                s3.prefix.clone().unwrap_or_default()
            )),
            region: s3.region.clone(),
            endpoint: s3.endpoint.clone(),
            path_style: s3.path_style.unwrap_or(false),
            ..Default::default()
        },
        None => StoreSpec::local(match group_prefix.trim_end_matches('/') {
            "" => ARCHIVE_DIR.to_string(),
            sub => format!("{ARCHIVE_DIR}/{sub}"),
        }),
    }
}

/// The target of one table: the source's PostgreSQL database, else a memory table.
fn target(source: &ArchiveSource, archive: &ResolvedArchive, t: &TableRef) -> TargetFile {
    match (&source.spec.target.memory, &source.spec.target.postgres) {
        (_, Some(pg)) => TargetFile {
            kind: Some(TargetKind::Postgres),
            connection_file: Some(TARGET_DSN_FILE.into()),
            schema: Some(pg.schema.clone().unwrap_or_else(|| t.schema().into())),
            table: Some(match (&pg.table, archive.tables.len()) {
                (Some(name), 1) => name.clone(),
                _ => t.name.clone(),
            }),
            split: pg.split,
            ..Default::default()
        },
        (Some(m), None) => TargetFile {
            kind: Some(TargetKind::Memory),
            index_fields: m.index_fields.clone().filter(|f| !f.is_empty()),
            ..Default::default()
        },
        (None, None) => TargetFile {
            kind: Some(TargetKind::Memory),
            ..Default::default()
        },
    }
}

pub fn engine_yaml(config: &EngineFile) -> String {
    config.to_yaml()
}
