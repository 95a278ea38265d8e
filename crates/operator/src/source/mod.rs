//! ArchiveSource: its reconcile, the engine it builds (StatefulSet, Services, ConfigMap, token,
//! NetworkPolicy) and the re-baseline feed read from the engine pods.

pub mod build;
pub mod conditions;
pub mod dereference;
pub mod engine_token;
pub mod labels;
pub mod observe;
pub mod rebaseline;
pub mod reconcile;
pub mod validate;

#[cfg(test)]
mod tests;
