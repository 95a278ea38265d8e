//! The labels of an ArchiveSource's children, apart from [`crate::source::build`] so that the
//! children it builds from other modules (the token Secret) can carry them too.

use std::collections::BTreeMap;

use kube::ResourceExt;

use crate::builders::{
    LABEL_COMPONENT, LABEL_MANAGED_BY, LABEL_NAME, LABEL_SOURCE, MANAGED_BY, labels,
};
use crate::crd::archive_source::ArchiveSource;

/// The labels every engine child carries and selects by.
pub fn selector_labels(source: &ArchiveSource) -> BTreeMap<String, String> {
    labels(&[
        (LABEL_NAME, "larch"),
        (LABEL_COMPONENT, "engine"),
        (LABEL_MANAGED_BY, MANAGED_BY),
        (LABEL_SOURCE, &source.name_any()),
    ])
}
