//! What the ArchiveRestore schema and its CEL rules cannot say (see [`crate::reconcile::validate`]).

use crate::crd::archive_restore::ArchiveRestore;
use crate::reconcile::validate::{affinity, key_prefix, tables};

/// What the ArchiveRestore schema cannot check.
pub fn restore(restore: &ArchiveRestore) -> Result<(), String> {
    let spec = &restore.spec;
    affinity(spec.pod.as_ref())?;
    if let Some(ts) = &spec.tables {
        tables("spec.tables", ts)?;
    }
    key_prefix("spec.archive.keyPrefix", spec.archive.key_prefix.as_deref())?;
    if let Some(time) = spec.at.as_ref().and_then(|a| a.time.as_deref())
        && time.parse::<jiff::Timestamp>().is_err()
    {
        return Err(format!(
            "spec.at.time {time:?} is not an RFC 3339 time such as 2026-11-30T14:00:00Z"
        ));
    }
    Ok(())
}
