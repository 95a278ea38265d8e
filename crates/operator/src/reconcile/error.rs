//! Why a reconcile failed: one variant per step, labelled for the reconcile-errors metric and
//! the Warning Event.

/// A child the API server refused (invalid, forbidden by an admission policy or a quota):
/// not retried until it changes, reported as a condition with the server's message.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the API server refused {kind} {name}: {message}")]
pub struct Rejected {
    pub kind: String,
    pub name: String,
    pub message: String,
}

/// Reconcile errors, one variant per step of a reconcile (dereference → apply → prune →
/// observe → status, and the deletion's finalizer and cleanup) or class of failure. The
/// [`Error::label`] is the `error` label of the reconcile-errors metric and the `action` of the
/// Warning Event a failed reconcile publishes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading what the spec names (an ArchiveExport, Secrets, ConfigMaps).
    #[error("dereferencing the spec's references: {0}")]
    Dereference(#[source] kube::Error),
    /// Sending a child (server-side apply).
    #[error("applying a child: {0}")]
    Apply(#[source] kube::Error),
    /// Listing or deleting children that are not wanted any more.
    #[error("pruning children: {0}")]
    Prune(#[source] kube::Error),
    /// Reading what the children report (Jobs, pods, Events).
    #[error("observing children: {0}")]
    Observe(#[source] kube::Error),
    /// Writing the owner's status.
    #[error("writing status: {0}")]
    Status(#[source] kube::Error),
    /// Adding or removing the cleanup finalizer.
    #[error("updating the finalizer: {0}")]
    Finalizer(#[source] kube::Error),
    /// A deletion's cleanup: stopping workloads, the cleanup Job, its report.
    #[error("deletion cleanup: {0}")]
    Cleanup(#[source] kube::Error),
    #[error(transparent)]
    Rejected(#[from] Rejected),
    #[error("object has no namespace")]
    NoNamespace,
    #[error("the operator's watch caches did not fill within 30s")]
    CacheNotReady,
}

impl Error {
    /// Every value of [`Error::label`] (the metrics start each at zero).
    pub const LABELS: [&'static str; 10] = [
        "Dereference",
        "Apply",
        "Prune",
        "Observe",
        "Status",
        "Finalizer",
        "Cleanup",
        "Rejected",
        "NoNamespace",
        "CacheNotReady",
    ];

    /// The step (or class) that failed, as metric label and Event action.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Dereference(_) => "Dereference",
            Error::Apply(_) => "Apply",
            Error::Prune(_) => "Prune",
            Error::Observe(_) => "Observe",
            Error::Status(_) => "Status",
            Error::Finalizer(_) => "Finalizer",
            Error::Cleanup(_) => "Cleanup",
            Error::Rejected(_) => "Rejected",
            Error::NoNamespace => "NoNamespace",
            Error::CacheNotReady => "CacheNotReady",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_label_is_listed_once() {
        let kube = || {
            kube::Error::Api(
                kube::core::Status::failure("refused", "Forbidden")
                    .with_code(403)
                    .boxed(),
            )
        };
        let rejected = Rejected {
            kind: "Job".into(),
            name: "j".into(),
            message: "no".into(),
        };
        let all = [
            Error::Dereference(kube()),
            Error::Apply(kube()),
            Error::Prune(kube()),
            Error::Observe(kube()),
            Error::Status(kube()),
            Error::Finalizer(kube()),
            Error::Cleanup(kube()),
            Error::Rejected(rejected),
            Error::NoNamespace,
            Error::CacheNotReady,
        ];
        let labels: Vec<&str> = all.iter().map(Error::label).collect();
        assert_eq!(labels, Error::LABELS);
    }
}
