//! Writes only on a difference, for all three controllers. Every child carries the hash of what
//! the operator last applied (annotation `larch.dev/applied-hash`); a reconcile whose desired
//! child hashes the same as the observed annotation sends nothing. Status is written only when
//! it differs from the observed status, Events only on transitions (the callers decide). Every
//! write is counted here, where the client issues it: `larch_operator_api_writes_total` and
//! `larch_operator_applies_unchanged_total`, by controller and kind.

use std::sync::Arc;

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::core::ObjectMeta;
use kube::runtime::events::Event;
use kube::runtime::reflector::{Lookup, ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Child;
use super::context::{Context, Error, Rejected};
use crate::operator::builders::short_hash;

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
        if let Some((refused, why)) = self.ctx.rejected.lock().unwrap().get(&key)
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
        let mut rejected = self.ctx.rejected.lock().unwrap();
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
            Err(e) => Err(e.into()),
        }
    }

    /// [`Self::apply`] against the cached copy of the child (same namespace and name); returns
    /// what was applied (`None`: nothing sent) and the cached copy.
    pub async fn apply_cached<K: Child, C>(
        &self,
        api: &Api<K>,
        desired: K,
        cache: &Store<C>,
    ) -> Result<(Option<K>, Option<Arc<C>>), Error>
    where
        C: Lookup + Resource + Clone + 'static,
        <C as Lookup>::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        let mut key = ObjectRef::<C>::new(&desired.name_any());
        if let Some(ns) = ResourceExt::namespace(&desired) {
            key = key.within(&ns);
        }
        let observed = cache.get(&key);
        let applied = self
            .apply(api, desired, observed.as_ref().map(|o| o.meta()))
            .await?;
        Ok((applied, observed))
    }

    /// [`Self::apply`] of a child no cache holds: reads it first; returns it as it now is.
    pub async fn apply_read<K: Child>(&self, api: &Api<K>, desired: K) -> Result<K, Error> {
        let observed = api.get_opt(&desired.name_any()).await?;
        match self
            .apply(api, desired, observed.as_ref().map(|o| o.meta()))
            .await?
        {
            Some(applied) => Ok(applied),
            None => Ok(observed.expect("an apply is skipped only for an observed object")),
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
            Some(d) => self.apply_read(api, d).await.map(drop),
            None => match api.get_metadata_opt(name).await? {
                Some(_) => self.delete(api, name).await,
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
    ) -> Result<(), kube::Error>
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
            .await?;
        }
        self.events(obj, events).await;
        Ok(())
    }

    /// Deletes a child (in the background); one already gone is fine.
    pub async fn delete<K: Child>(&self, api: &Api<K>, name: &str) -> Result<(), Error> {
        self.count(&K::kind(&()), "delete");
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Publishes Events about `obj` (best effort: a failed publish does not fail the reconcile).
    async fn events<K: Resource<DynamicType = ()>>(&self, obj: &K, events: &[Event]) {
        let reference = obj.object_ref(&());
        for e in events {
            self.count("Event", "create");
            if let Err(err) = self.ctx.recorder.publish(e, &reference).await {
                tracing::warn!(%err, controller = self.controller, object = %obj.name_any(), "could not publish event");
            }
        }
    }
}

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
