//! The custom resources (`larch.dev/v1alpha1`) and their generated definitions.

pub mod archive_export;
pub mod archive_restore;
pub mod archive_source;
pub mod archive_source_set;
pub mod common;
pub mod common_pod;
pub mod progress;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub use archive_export::{ArchiveExport, ArchiveExportSpec, ArchiveExportStatus};
pub use archive_restore::{ArchiveRestore, ArchiveRestoreSpec, ArchiveRestoreStatus};
pub use archive_source::{ArchiveSource, ArchiveSourceSpec, ArchiveSourceStatus};
pub use archive_source_set::{ArchiveSourceSet, ArchiveSourceSetSpec, ArchiveSourceSetStatus};

/// Every CRD with the file name it is kept under in `crds/`.
pub fn all() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![
        ("archiveexports.larch.dev.yaml", ArchiveExport::crd()),
        ("archivesources.larch.dev.yaml", ArchiveSource::crd()),
        ("archivesourcesets.larch.dev.yaml", ArchiveSourceSet::crd()),
        ("archiverestores.larch.dev.yaml", ArchiveRestore::crd()),
    ]
}

/// One CRD as YAML (one document, no leading `---`).
pub fn to_yaml(crd: &CustomResourceDefinition) -> String {
    serde_saphyr::to_string(crd).expect("a CRD serialises to YAML")
}

/// Every CRD as a multi-document YAML stream (what `larch crd` prints).
pub fn all_yaml() -> String {
    all()
        .iter()
        .map(|(_, crd)| format!("---\n{}", to_yaml(crd)))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests;
