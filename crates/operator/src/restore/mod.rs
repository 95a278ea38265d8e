//! ArchiveRestore: its reconcile and the restore Job it builds.

pub mod build;
pub mod conditions;
pub mod reconcile;

#[cfg(test)]
mod tests;
