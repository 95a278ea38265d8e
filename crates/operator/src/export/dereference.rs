//! What an ArchiveExport's pods mount or read, for the dereference step
//! ([`crate::reconcile::dereference`]).

use crate::crd::archive_export::ArchiveExport;
use crate::reconcile::dereference::{Reference, ca_reference, location_references};

/// Everything an ArchiveExport's pods mount or read.
pub fn export_references(export: &ArchiveExport) -> Vec<Reference> {
    let src = &export.spec.source;
    let mut out = vec![Reference::secret(
        &src.connection_secret_ref.name,
        &src.connection_secret_ref.key,
        "spec.source.connectionSecretRef",
    )];
    if let Some(ca) = &src.ca_bundle {
        out.extend(ca_reference(ca, "spec.source.caBundle"));
    }
    out.extend(location_references(
        &export.spec.destination,
        "spec.destination",
    ));
    // The hash key of the masking rules: without it the exporter cannot start.
    if let Some(k) = export
        .spec
        .transform
        .as_ref()
        .and_then(|t| t.key_secret_ref.as_ref())
    {
        out.push(Reference::secret(
            &k.name,
            &k.key,
            "spec.transform.keySecretRef",
        ));
    }
    out
}
