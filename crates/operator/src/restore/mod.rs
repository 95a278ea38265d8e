//! ArchiveRestore: its reconcile and the restore Job it builds.

pub mod build;
pub mod conditions;
pub mod dereference;
pub mod progress;
pub mod reconcile;
pub mod validate;

#[cfg(test)]
mod tests;
