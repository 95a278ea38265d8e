//! Writes only on a difference, for all three controllers. Every child carries the hash of what
//! the operator last applied (annotation `larch.dev/applied-hash`); a reconcile whose desired
//! child hashes the same as the observed annotation sends nothing. Status is written only when
//! it differs from the observed status, Events only on transitions (the callers decide). Every
//! write is counted here, where the client issues it: `larch_operator_api_writes_total` and
//! `larch_operator_applies_unchanged_total`, by controller and kind.

use larch_core::locks::MutexExt;
use std::collections::HashSet;
use std::sync::Arc;

use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::ObjectMeta;
use kube::runtime::events::Event;
use kube::runtime::reflector::{Lookup, ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Child;
use super::context::{Context, Error, Rejected};
use crate::builders::short_hash;

/// Annotation on every applied child: the hash of the applied object (without this annotation).
pub const ANNOTATION_APPLIED_HASH: &str = "larch.dev/applied-hash";

/// The hash of an object as the operator applies it, keyed by its owners' uids: a Secret copy's
/// hash changes with its data but reveals nothing usable about it.
pub fn applied_hash<K: Child>(obj: &K) -> String {
    let mut buf: Vec<u8> = obj
        .meta()
        .owner_references
        .iter()
        .flatten()
        .flat_map(|r| r.uid.bytes().chain([0]))
        .collect();
    serde_json::to_writer(&mut buf, obj).expect("Kubernetes objects serialise");
    short_hash(&buf, 16)
}

/// Whether an observed child already is what `hash` stands for (and is not going away).
pub fn is_current(observed: &ObjectMeta, hash: &str) -> bool {
    observed.deletion_timestamp.is_none()
        && observed
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_APPLIED_HASH))
            .is_some_and(|h| h == hash)
}

/// One controller's writes: server-side apply as its field manager, deletes, status, Events.
pub struct Applier<'a> {
    ctx: &'a Context,
    controller: &'static str,
    manager: &'static str,
}

impl<'a> Applier<'a> {
    pub fn new(ctx: &'a Context, controller: &'static str, manager: &'static str) -> Self {
        Self {
            ctx,
            controller,
            manager,
        }
    }

    /// Counts a write request this controller sends itself (one the Applier does not send).
    pub fn count(&self, kind: &str, verb: &str) {
        self.ctx
            .metrics
            .api_writes
            .with_label_values(&[self.controller, kind, verb])
            .inc();
    }

    /// Server-side apply of `desired` (forcing: the operator owns every field it sets), unless
    /// `observed` (the child's metadata, from a cache or a read) carries its hash already.
    /// Returns the applied object, or `None` when nothing was sent. A child the API server
    /// refuses (400, 403, 422) is [`Rejected`], and the same child is not sent again.
    pub async fn apply<K: Child>(
        &self,
        api: &Api<K>,
        mut desired: K,
        observed: Option<&ObjectMeta>,
    ) -> Result<Option<K>, Error> {
        let kind = K::kind(&()).to_string();
        let hash = applied_hash(&desired);
        if observed.is_some_and(|o| is_current(o, &hash)) {
            self.ctx
                .metrics
                .applies_unchanged
                .with_label_values(&[self.controller, &kind])
                .inc();
            return Ok(None);
        }
        let name = desired.name_any();
        let key = format!(
            "{kind}/{}/{name}",
            ResourceExt::namespace(&desired).unwrap_or_default()
        );
        if let Some((refused, why)) = self.ctx.rejected.locked().get(&key)
            && *refused == hash
        {
            return Err(why.clone().into());
        }
        desired
            .annotations_mut()
            .insert(ANNOTATION_APPLIED_HASH.into(), hash.clone());
        self.count(&kind, "apply");
        let applied = api
            .patch(
                &name,
                &PatchParams::apply(self.manager).force(),
                &Patch::Apply(&desired),
            )
            .await;
        let mut rejected = self.ctx.rejected.locked();
        match applied {
            Ok(out) => {
                rejected.remove(&key);
                Ok(Some(out))
            }
            Err(kube::Error::Api(s)) if matches!(s.code, 400 | 403 | 422) => {
                let why = Rejected {
                    kind,
                    name,
                    message: s.message.clone(),
                };
                rejected.insert(key, (hash, why.clone()));
                Err(why.into())
            }
            Err(e) => Err(Error::Apply(e)),
        }
    }

    /// An optional child no cache holds: applied when `desired`, else deleted if it exists
    /// (reads it either way, so a steady state sends no write).
    pub async fn apply_or_prune<K: Child>(
        &self,
        api: &Api<K>,
        name: &str,
        desired: Option<K>,
    ) -> Result<(), Error> {
        match desired {
            Some(d) => {
                let observed = api.get_opt(&d.name_any()).await.map_err(Error::Apply)?;
                self.apply(api, d, observed.as_ref().map(|o| o.meta()))
                    .await
                    .map(drop)
            }
            None => match api.get_metadata_opt(name).await.map_err(Error::Prune)? {
                Some(_) => self.delete(api, name).await.map_err(Error::Prune),
                None => Ok(()),
            },
        }
    }

    /// Applies the status of `obj` (as this field manager) when it differs from the observed
    /// one, then publishes `events` about it.
    pub async fn report<K, S>(
        &self,
        api: &Api<K>,
        obj: &K,
        observed: Option<&S>,
        status: &S,
        events: &[Event],
    ) -> Result<(), Error>
    where
        K: Child,
        S: serde::Serialize + PartialEq,
    {
        if observed != Some(status) {
            let body = json!({
                "apiVersion": K::api_version(&()),
                "kind": K::kind(&()),
                "status": status,
            });
            self.count(&K::kind(&()), "apply-status");
            api.patch_status(
                &obj.name_any(),
                &PatchParams::apply(self.manager).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(Error::Status)?;
        }
        self.events(obj, events).await;
        Ok(())
    }

    /// Deletes a child (in the background); one already gone is fine.
    pub async fn delete<K: Child>(&self, api: &Api<K>, name: &str) -> Result<(), kube::Error> {
        self.count(&K::kind(&()), "delete");
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Publishes Events about `obj` (best effort: a failed publish does not fail the reconcile).
    pub async fn events<K: Resource<DynamicType = ()>>(&self, obj: &K, events: &[Event]) {
        let reference = obj.object_ref(&());
        for e in events {
            self.count("Event", "create");
            if let Err(err) = self.ctx.recorder.publish(e, &reference).await {
                tracing::warn!(%err, controller = self.controller, object = %obj.name_any(), "could not publish event");
            }
        }
    }
}

/// The children one owner applies in one reconcile (after Stackable's `ClusterResources`): each
/// is applied through the [`Applier`] and remembered; [`ChildSet::prune`] then deletes the
/// owner's children (by label) that this round neither applied nor kept.
pub struct ChildSet<'a> {
    applier: &'a Applier<'a>,
    /// The label selector of the owner's children.
    selector: String,
    /// `kind/namespace/name` of what this round applied or kept.
    wanted: HashSet<String>,
}

fn child_key(kind: &str, namespace: &str, name: &str) -> String {
    format!("{kind}/{namespace}/{name}")
}

impl<'a> ChildSet<'a> {
    pub fn new(applier: &'a Applier<'a>, selector: impl Into<String>) -> Self {
        Self {
            applier,
            selector: selector.into(),
            wanted: HashSet::new(),
        }
    }

    fn api<K: NamespacedChild>(&self, namespace: &str) -> Api<K> {
        Api::namespaced(self.applier.ctx.client.clone(), namespace)
    }

    /// Marks a child as wanted without sending it (it stays, whatever this round did).
    pub fn keep<K: NamespacedChild>(&mut self, namespace: &str, name: &str) {
        self.wanted
            .insert(child_key(&K::kind(&()), namespace, name));
    }

    fn namespace_of<K: NamespacedChild>(desired: &K) -> Result<String, Error> {
        ResourceExt::namespace(desired).ok_or(Error::NoNamespace)
    }

    /// Applies `desired` unless `observed` (its metadata as last seen) carries its hash
    /// already; returns what was applied (`None`: nothing sent).
    pub async fn apply_over<K: NamespacedChild>(
        &mut self,
        desired: K,
        observed: Option<&ObjectMeta>,
    ) -> Result<Option<K>, Error> {
        let ns = Self::namespace_of(&desired)?;
        self.keep::<K>(&ns, &desired.name_any());
        self.applier.apply(&self.api(&ns), desired, observed).await
    }

    /// Applies a child against its cached copy (same namespace and name); returns what was
    /// applied (`None`: nothing sent) and the cached copy.
    pub async fn apply_cached<K: NamespacedChild, C>(
        &mut self,
        desired: K,
        cache: &Store<C>,
    ) -> Result<(Option<K>, Option<Arc<C>>), Error>
    where
        C: Lookup + Resource + Clone + 'static,
        <C as Lookup>::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        let ns = Self::namespace_of(&desired)?;
        let observed = cache.get(&ObjectRef::<C>::new(&desired.name_any()).within(&ns));
        let applied = self
            .apply_over(desired, observed.as_ref().map(|o| o.meta()))
            .await?;
        Ok((applied, observed))
    }

    /// Applies a child no cache holds: reads it first; returns it as it now is.
    pub async fn apply<K: NamespacedChild>(&mut self, desired: &K) -> Result<K, Error> {
        let ns = Self::namespace_of(desired)?;
        let observed = self
            .api::<K>(&ns)
            .get_opt(&desired.name_any())
            .await
            .map_err(Error::Apply)?;
        let applied = self
            .apply_over(desired.clone(), observed.as_ref().map(|o| o.meta()))
            .await?;
        Ok(applied
            .or(observed)
            .expect("an apply is skipped only for an observed object"))
    }

    /// Deletes the owner's children of kind `K` in `namespace` (listed by the selector) that
    /// this round did not apply or keep; returns how many.
    pub async fn prune<K: NamespacedChild>(&mut self, namespace: &str) -> Result<usize, Error> {
        let api = self.api::<K>(namespace);
        let listed = api
            .list(&ListParams::default().labels(&self.selector))
            .await
            .map_err(Error::Prune)?;
        let children = listed
            .iter()
            .map(|o| (namespace.to_string(), o.name_any()))
            .collect();
        self.prune_among::<K>(children).await
    }

    /// Deletes those of `children` (namespace, name; known from a cache) that this round did
    /// not apply or keep; returns how many.
    pub async fn prune_among<K: NamespacedChild>(
        &mut self,
        children: Vec<(String, String)>,
    ) -> Result<usize, Error> {
        let kind = K::kind(&());
        let mut deleted = 0;
        for (ns, name) in children {
            if !self.wanted.contains(&child_key(&kind, &ns, &name)) {
                self.applier
                    .delete(&self.api::<K>(&ns), &name)
                    .await
                    .map_err(Error::Prune)?;
                deleted += 1;
            }
        }
        Ok(deleted)
    }
}

/// A child in a namespace (every child the controllers apply).
pub trait NamespacedChild: Child + Resource<Scope = k8s_openapi::NamespaceResourceScope> {}
impl<K> NamespacedChild for K where K: Child + Resource<Scope = k8s_openapi::NamespaceResourceScope> {}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn cm(data: &str, owner: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some("c".into());
        c.metadata.owner_references = Some(vec![OwnerReference {
            uid: owner.into(),
            ..Default::default()
        }]);
        c.data = Some([("k".to_string(), data.to_string())].into());
        c
    }

    #[test]
    fn the_hash_follows_content_and_owner() {
        let h = applied_hash(&cm("a", "u1"));
        assert_eq!(h.len(), 16);
        assert_eq!(h, applied_hash(&cm("a", "u1")), "stable");
        assert_ne!(h, applied_hash(&cm("b", "u1")), "content");
        assert_ne!(h, applied_hash(&cm("a", "u2")), "keyed by the owner");
        let mut seen = ObjectMeta::default();
        assert!(!is_current(&seen, &h), "no annotation: apply");
        seen.annotations = Some([(ANNOTATION_APPLIED_HASH.to_string(), h.clone())].into());
        assert!(is_current(&seen, &h));
        assert!(!is_current(&seen, "0000000000000000"));
        seen.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::UNIX_EPOCH,
        ));
        assert!(!is_current(&seen, &h), "going away: apply");
    }
}
