//! The names of an ArchiveExport's replication slots and publications, and the owner larch
//! records them for (issue 35: names of different exports never collide, and only the owner
//! drops them).

use crate::crd::archive_export::ArchiveExport;
use crate::crd::common::TableRef;

/// `larch_<namespace>_<name>_<hash>`: the readable part lower-case `[a-z0-9_]` (cut to fit),
/// the hash (12 hex digits) of the raw `<namespace>/<name>` (and, per table, `/<schema.table>`),
/// so exports whose readable parts map alike (`team-a`/`b-users`, `team-a-b`/`users`) never
/// share a slot. At most 63 bytes (a PostgreSQL identifier).
pub fn derived_slot_name(export: &ArchiveExport, table: &TableRef) -> String {
    let (ns, name) = identity(export);
    let table = Some(table)
        .filter(|_| export.spec.source.tables.is_some())
        .map(TableRef::qualified);
    export_slot_name(ns, name, table.as_deref())
}

/// The temporary slot of a set's export ([`crate::export::build::exports_as_one_set`]).
pub fn set_slot_name(export: &ArchiveExport) -> String {
    let (ns, name) = identity(export);
    export_slot_name(ns, name, None)
}

fn identity(export: &ArchiveExport) -> (&str, &str) {
    (
        export.metadata.namespace.as_deref().unwrap_or("default"),
        export.metadata.name.as_deref().unwrap_or("export"),
    )
}

/// Who an export's slots and publications are recorded for (`larch export --owner`).
pub fn export_owner(export: &ArchiveExport) -> String {
    let (ns, name) = identity(export);
    format!("archiveexport/{ns}/{name}")
}

/// [`derived_slot_name`] from the raw identity: `table` is the qualified table of one table's
/// export among several (`None`: a single table's, or a set's).
pub fn export_slot_name(namespace: &str, name: &str, table: Option<&str>) -> String {
    let mut raw = format!("{namespace}/{name}");
    if let Some(t) = table {
        raw.push('/');
        raw.push_str(t);
    }
    let hash = crate::builders::short_hash(raw.as_bytes(), 12);
    let mut readable = sanitize(&format!("larch_{namespace}_{name}"));
    readable.truncate(63 - 1 - hash.len());
    format!("{readable}_{hash}")
}

/// The name larch 0.1.0 derived (`larch_<ns>_<name>[_<table hash>]`, no identity hash),
/// which an upgraded operator keeps using when the export's status records it.
pub fn legacy_slot_name(export: &ArchiveExport, table: &TableRef) -> String {
    let (ns, name) = identity(export);
    let mut base = format!("larch_{ns}_{name}");
    if export.spec.source.tables.is_some() {
        base.push('_');
        base.push_str(&crate::builders::short_hash(
            table.qualified().as_bytes(),
            8,
        ));
    }
    let clean = sanitize(&base);
    if clean.len() <= 63 {
        return clean;
    }
    let hash = crate::builders::short_hash(clean.as_bytes(), 8);
    format!("{}_{hash}", &clean[..54])
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// The replication slot and publication `larch export` uses for `table`: the spec's names,
/// else the slot derived from the export and the publication named like the slot. An export
/// whose status records a writer on the slot an older operator derived
/// ([`legacy_slot_name`]) keeps that slot, so an upgrade neither orphans it nor re-baselines.
pub fn slot_and_publication(export: &ArchiveExport, table: &TableRef) -> (String, String) {
    let src = &export.spec.source;
    let slot = src.slot_name.clone().unwrap_or_else(|| {
        let legacy = legacy_slot_name(export, table);
        let recorded = export.status.as_ref().is_some_and(|s| {
            s.writers
                .iter()
                .any(|w| w.table == table.qualified() && w.slot.as_deref() == Some(legacy.as_str()))
        });
        if recorded {
            legacy
        } else {
            derived_slot_name(export, table)
        }
    });
    let publication = src.publication_name.clone().unwrap_or_else(|| slot.clone());
    (slot, publication)
}
