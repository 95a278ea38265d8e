//! ArchiveExport: its reconcile, the children it builds (Job, CronJob or Deployment, the
//! slot monitor), its replication slots and Leases, and the finalizer that cleans up its slots.

pub mod build;
pub mod children;
pub mod cleanup_job;
pub mod conditions;
pub mod dereference;
pub mod finalizer;
pub mod lease_rights;
pub mod observe;
pub mod reconcile;
pub mod slot_names;
pub mod slots;
pub mod split;
pub mod validate;
pub mod writers;

#[cfg(test)]
mod tests;
