//! What the controllers share: applying children ([`apply`]), the reconcile context and its
//! errors, status and Event writing, owned pods and Jobs, probes, pod failures and progress, and
//! the controller runner ([`run`]). Each kind's own reconcile lives in its folder
//! (`crate::export::reconcile`, `crate::source::reconcile`, ...). Each owns its children (owner
//! references, so child changes and deletions re-trigger the owner) and applies them with its
//! own field manager, only where they differ from what is there. The one finalizer,
//! `larch.dev/cleanup` on ArchiveExports, is in `crate::export::finalizer`.

pub mod apply;
pub mod conditions;
pub mod context;
pub mod dereference;
pub mod error;
pub mod job;
pub mod owned;
pub mod pod_failure;
pub mod probe;
pub mod progress;
pub mod runner;
pub mod status;
pub mod step;
pub mod validate;

/// What the controllers apply: any Kubernetes object they can serialise and read back.
pub trait Child:
    kube::Resource<DynamicType = ()>
    + Clone
    + serde::Serialize
    + serde::de::DeserializeOwned
    + std::fmt::Debug
{
}
impl<K> Child for K where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug
{
}

#[cfg(test)]
pub(crate) mod tests;
