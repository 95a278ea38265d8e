//! What a set's reconcile reads of its world from the controllers' caches (and, with a
//! restoreTemplate, one labelled list of its ArchiveRestores), before it applies anything.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;

use crate::crd::archive_restore::ArchiveRestore;
use crate::crd::archive_source::ArchiveSource;
use crate::crd::archive_source_set::ArchiveSourceSet;
use crate::reconcile::context::{Context, Error, cache_ready};
use crate::source_set::build::{
    LABEL_SOURCE_SET, ca_copy_name, copy_name, per_namespace_secret, selected_namespaces,
    shared_ca_name, stamps_restores,
};

/// What the caches hold of the set's world: the selected namespaces and the objects with the
/// names the set uses (its labelled ArchiveSources, the Secrets' metadata: copies, and the
/// Secret the template names per namespace).
pub struct Observed {
    pub selected: Vec<String>,
    /// ArchiveSources of the set's name (labelled), by namespace.
    pub sources: BTreeMap<String, Arc<ArchiveSource>>,
    /// Secrets of the copy's name, by namespace.
    pub copies: BTreeMap<String, Arc<PartialObjectMeta<Secret>>>,
    /// Namespaces holding the Secret the template names.
    pub has_secret: HashSet<String>,
    /// CA bundle copies (the operator's labelled ConfigMaps of the copy's name), by namespace.
    pub ca_copies: BTreeMap<String, Arc<PartialObjectMeta<ConfigMap>>>,
    /// With a restoreTemplate: the set's ArchiveRestores (one labelled list a reconcile), by
    /// namespace.
    pub restores: BTreeMap<String, Arc<ArchiveRestore>>,
}

impl Observed {
    pub async fn from_caches(set: &ArchiveSourceSet, ctx: &Context) -> Result<Self, Error> {
        let caches = &ctx.caches;
        cache_ready(&caches.namespaces).await?;
        cache_ready(&caches.set_sources).await?;
        cache_ready(&caches.secrets).await?;
        let name = set.name_any();
        let copy = copy_name(set);
        let has_secret = match per_namespace_secret(set) {
            Some(n) => caches
                .secrets
                .state_filter(|s| s.name_any() == n)
                .iter()
                .filter_map(|s| s.namespace())
                .collect(),
            None => HashSet::new(),
        };
        // The labelled ConfigMaps are cached for the engines anyway; wait for them only when
        // the set has CA copies to look at.
        let ca_copies = if shared_ca_name(set).is_some() {
            cache_ready(&caches.config_maps).await?;
            let copy = ca_copy_name(set);
            by_namespace(caches.config_maps.state_filter(|c| c.name_any() == copy))
        } else {
            BTreeMap::new()
        };
        // Listed (one request) only by a set that stamps restores, or did (its status lists
        // them): a source set switched from a restoreTemplate prunes them.
        let stamped = set.status.as_ref().is_some_and(|s| !s.restores.is_empty());
        let restores = if stamps_restores(set) || stamped {
            Api::<ArchiveRestore>::all(ctx.client.clone())
                .list(&ListParams::default().labels(&format!("{LABEL_SOURCE_SET}={name}")))
                .await
                .map_err(Error::Observe)?
                .items
                .into_iter()
                .map(Arc::new)
                .collect()
        } else {
            vec![]
        };
        Ok(Self {
            restores: by_namespace(restores),
            selected: selected_namespaces(set, caches.namespaces.state().iter().map(|n| &**n)),
            sources: by_namespace(caches.set_sources.state_filter(|s| s.name_any() == name)),
            copies: by_namespace(caches.secrets.state_filter(|s| s.name_any() == copy)),
            has_secret,
            ca_copies,
        })
    }
}

fn by_namespace<K: kube::Resource>(objects: Vec<Arc<K>>) -> BTreeMap<String, Arc<K>> {
    objects
        .into_iter()
        .map(|o| (o.meta().namespace.clone().unwrap_or_default(), o))
        .collect()
}
