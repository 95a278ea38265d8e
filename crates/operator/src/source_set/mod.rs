//! ArchiveSourceSet: its reconcile, the per-namespace ArchiveSources, ArchiveRestores and
//! Secret copies it builds, and the seed head it reads from the archive.

pub mod build;
pub mod conditions;
pub mod observed;
pub mod reconcile;
pub mod seed_head;

#[cfg(test)]
mod tests;
