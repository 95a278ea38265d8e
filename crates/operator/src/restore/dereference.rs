//! What an ArchiveRestore's pod mounts or reads, for the dereference step
//! ([`crate::reconcile::dereference`]).

use crate::crd::archive_export::ArchiveExport;
use crate::crd::archive_restore::ArchiveRestore;
use crate::reconcile::dereference::{Reference, archive_references, target_references};

/// Everything an ArchiveRestore's pod mounts or reads.
pub fn restore_references(
    restore: &ArchiveRestore,
    export: Option<&ArchiveExport>,
) -> Vec<Reference> {
    let spec = &restore.spec;
    let mut out = archive_references(&spec.archive, export);
    let pg = &spec.target.postgres;
    out.extend(target_references(
        &pg.connection_secret_ref,
        pg.ca_bundle.as_ref(),
    ));
    out
}
