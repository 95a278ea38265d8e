//! What the ArchiveSource schema and its CEL rules cannot say (see [`crate::reconcile::validate`]).

use crate::crd::archive_source::ArchiveSource;
use crate::reconcile::validate::{affinity, key_prefix, tables};

/// What an ArchiveSource's spec says that cannot work; the message names the field.
pub fn source(source: &ArchiveSource) -> Result<(), String> {
    let spec = &source.spec;
    affinity(spec.pod.as_ref())?;
    if let Some(t) = &spec.table {
        tables("spec.table", std::slice::from_ref(t))?;
    }
    if let Some(ts) = &spec.tables {
        tables("spec.tables", ts)?;
    }
    key_prefix("spec.archive.keyPrefix", spec.archive.key_prefix.as_deref())?;
    if let Some(np) = &spec.network_policy {
        np.peers()?;
    }
    Ok(())
}
