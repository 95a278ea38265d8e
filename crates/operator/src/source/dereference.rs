//! What an ArchiveSource's engines mount or read, for the dereference step
//! ([`crate::reconcile::dereference`]).

use crate::crd::archive_export::ArchiveExport;
use crate::crd::archive_source::ArchiveSource;
use crate::reconcile::dereference::{Reference, archive_references, target_references};

/// Everything an ArchiveSource's engines mount or read; with `exportRef` the location is the
/// export's (`export`), named as its field.
pub fn source_references(source: &ArchiveSource, export: Option<&ArchiveExport>) -> Vec<Reference> {
    let spec = &source.spec;
    let mut out = archive_references(&spec.archive, export);
    if let Some(pg) = &spec.target.postgres {
        out.extend(target_references(
            &pg.connection_secret_ref,
            pg.ca_bundle.as_ref(),
        ));
    }
    out
}
