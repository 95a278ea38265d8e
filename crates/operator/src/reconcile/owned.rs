//! Which listed pods the operator created: a pod counts only when its chain of controller owner
//! references (pod → ReplicaSet/Job → Deployment/StatefulSet/CronJob → …) reaches the custom
//! resource's UID, each link checked against the object it names (kind, name and UID). A label
//! is not enough: any tenant can put `larch.dev/source=<name>` on a pod of its own, and the
//! operator reads pods' `/status` and termination messages into status and Events.

use std::collections::HashMap;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::Api;
use kube::{Client, Resource};

/// Controller links followed at most (pod → Job → CronJob → custom resource is three).
const MAX_DEPTH: usize = 4;

/// The workloads between pods and their root, by UID: what [`is_owned`] follows.
pub type Workloads = HashMap<String, ObjectMeta>;

/// The controller owner reference of an object.
fn controller(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// Whether `pod`'s controller chain reaches `root_uid` through `workloads` (each link's object,
/// looked up by the reference's UID, must carry that UID, name and kind).
pub fn is_owned(pod: &ObjectMeta, root_uid: &str, workloads: &Workloads) -> bool {
    let mut link = controller(pod);
    for _ in 0..MAX_DEPTH {
        let Some(r) = link else { return false };
        if r.uid == root_uid {
            return true;
        }
        let Some(w) = workloads.get(&r.uid) else {
            return false;
        };
        if w.uid.as_deref() != Some(r.uid.as_str()) || w.name.as_deref() != Some(&r.name) {
            return false;
        }
        link = controller(w);
    }
    false
}

/// The pods of `pods` whose controller chain reaches `root_uid`, reading the workloads on the
/// way (by name, in `ns`) as needed.
pub async fn owned_pods(
    client: &Client,
    ns: &str,
    root_uid: &str,
    pods: Vec<Pod>,
) -> Result<Vec<Pod>, kube::Error> {
    if root_uid.is_empty() {
        return Ok(Vec::new());
    }
    let mut workloads = Workloads::new();
    let mut frontier: Vec<OwnerReference> = pods
        .iter()
        .filter_map(|p| controller(&p.metadata).cloned())
        .collect();
    for _ in 0..MAX_DEPTH {
        let mut next = Vec::new();
        for r in std::mem::take(&mut frontier) {
            if r.uid == root_uid || workloads.contains_key(&r.uid) {
                continue;
            }
            if let Some(meta) = workload(client, ns, &r).await?
                && meta.uid.as_deref() == Some(r.uid.as_str())
            {
                next.extend(controller(&meta).cloned());
                workloads.insert(r.uid.clone(), meta);
            }
        }
        if next.is_empty() {
            break;
        }
        frontier = next;
    }
    Ok(pods
        .into_iter()
        .filter(|p| is_owned(&p.metadata, root_uid, &workloads))
        .collect())
}

/// The metadata of the workload `r` names, when it is of a kind the operator creates and exists.
async fn workload(
    client: &Client,
    ns: &str,
    r: &OwnerReference,
) -> Result<Option<ObjectMeta>, kube::Error> {
    async fn get<K>(
        client: &Client,
        ns: &str,
        r: &OwnerReference,
    ) -> Result<Option<ObjectMeta>, kube::Error>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        if r.api_version != K::api_version(&()) {
            return Ok(None);
        }
        let api: Api<K> = Api::namespaced(client.clone(), ns);
        Ok(api.get_opt(&r.name).await?.map(|o| o.meta().clone()))
    }
    match r.kind.as_str() {
        "ReplicaSet" => get::<ReplicaSet>(client, ns, r).await,
        "Deployment" => get::<Deployment>(client, ns, r).await,
        "StatefulSet" => get::<StatefulSet>(client, ns, r).await,
        "Job" => get::<Job>(client, ns, r).await,
        "CronJob" => get::<CronJob>(client, ns, r).await,
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(name: &str, uid: &str, owner: Option<(&str, &str, &str)>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            uid: Some(uid.into()),
            owner_references: owner.map(|(kind, name, uid)| {
                vec![OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: kind.into(),
                    name: name.into(),
                    uid: uid.into(),
                    controller: Some(true),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_pod_whose_controller_chain_reaches_the_custom_resource_counts() {
        let cr = "cr-uid";
        let deployment = meta(
            "events-writer",
            "dep-uid",
            Some(("ArchiveExport", "events", cr)),
        );
        let rs = meta(
            "events-writer-5d8f",
            "rs-uid",
            Some(("Deployment", "events-writer", "dep-uid")),
        );
        let workloads: Workloads = [deployment, rs]
            .into_iter()
            .map(|m| (m.uid.clone().unwrap(), m))
            .collect();
        // pod → ReplicaSet → Deployment → ArchiveExport.
        let ours = meta(
            "events-writer-5d8f-x",
            "p1",
            Some(("ReplicaSet", "events-writer-5d8f", "rs-uid")),
        );
        assert!(is_owned(&ours, cr, &workloads));
        // A pod of a StatefulSet the custom resource controls directly.
        let engine = meta("src-0", "p2", Some(("StatefulSet", "src", "sts-uid")));
        let sts = meta("src", "sts-uid", Some(("ArchiveSource", "src", cr)));
        let with_sts: Workloads = [("sts-uid".to_string(), sts)].into();
        assert!(is_owned(&engine, cr, &with_sts));
        // Labels alone, no owner: a tenant's pod.
        assert!(!is_owned(&meta("fake", "p3", None), cr, &workloads));
        // An owner that is not one of the workloads, or a reference whose name does not match
        // the object of that UID.
        let stray = meta("fake", "p4", Some(("ReplicaSet", "theirs", "other-uid")));
        assert!(!is_owned(&stray, cr, &workloads));
        let renamed = meta("fake", "p5", Some(("ReplicaSet", "not-the-name", "rs-uid")));
        assert!(!is_owned(&renamed, cr, &workloads));
        // A chain ending at another custom resource.
        assert!(!is_owned(&ours, "another-cr", &workloads));
        // A non-controller owner reference is not a controller chain.
        let mut weak = ours.clone();
        weak.owner_references.as_mut().unwrap()[0].controller = None;
        assert!(!is_owned(&weak, cr, &workloads));
        // A cycle ends.
        let a = meta("a", "a-uid", Some(("ReplicaSet", "b", "b-uid")));
        let b = meta("b", "b-uid", Some(("ReplicaSet", "a", "a-uid")));
        let cyclic: Workloads = [("a-uid".to_string(), a.clone()), ("b-uid".to_string(), b)].into();
        assert!(!is_owned(&a, cr, &cyclic));
    }
}
