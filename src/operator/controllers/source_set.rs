//! The ArchiveSourceSet controller: dereference the shared credentials → select namespaces →
//! per namespace copy the Secret (opt-in only) and apply the ArchiveSource (server-side apply,
//! one field manager; objects of the same name it does not own are conflicts, never taken over)
//! → delete what it owns in namespaces that are no longer selected → roll the children's
//! conditions up into status.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::context::{Context, Error, MANAGER_SOURCE_SET};
use crate::operator::builders::source_set::{
    LABEL_SOURCE_SET, child_source, copy_name, credentials_digest, owned_by, per_namespace_secret,
    secret_copy, selected_namespaces, shares_credentials,
};
use crate::operator::conditions::{
    self, SOURCE_SET_TYPES, SetObservation, namespace_state, source_set_conditions,
};
use crate::operator::crd::archive_source::ArchiveSource;
use crate::operator::crd::archive_source_set::{
    ArchiveSourceSet, ArchiveSourceSetStatus, FailingNamespace,
};
use crate::operator::crd::common::Condition;

const MAX_FAILING: usize = 64;
const MAX_MESSAGE: usize = 4096;

async fn apply<K: super::Child>(api: &Api<K>, obj: &K) -> Result<K, kube::Error> {
    super::apply_as(api, obj, MANAGER_SOURCE_SET).await
}

async fn delete<K>(api: &Api<K>, name: &str) -> Result<(), Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn by_name(name: &str) -> ListParams {
    ListParams::default().fields(&format!("metadata.name={name}"))
}

fn problem(reason: &str, message: String) -> (String, String) {
    (reason.to_string(), message)
}

/// Events when the set becomes ready or starts failing (first visits only when abnormal).
fn transition_events(before: &[Condition], after: &[Condition]) -> Vec<Event> {
    let mut out = vec![];
    for c in conditions::transitions(before, after) {
        let first = !before.iter().any(|b| b.type_ == c.type_);
        let (type_, reason) = match (c.type_.as_str(), c.status.as_str()) {
            (conditions::READY, "True") => (EventType::Normal, "Ready"),
            (conditions::STALLED, "True") => (EventType::Warning, c.reason.as_str()),
            (conditions::STALLED, "False") if !first => (EventType::Normal, "Recovered"),
            _ => continue,
        };
        out.push(Event {
            type_,
            reason: reason.into(),
            note: Some(c.message.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        });
    }
    out
}

pub async fn reconcile(set: Arc<ArchiveSourceSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    if set.metadata.deletion_timestamp.is_some() {
        // Owner references: the garbage collector removes the children.
        return Ok(Action::await_change());
    }
    let client = ctx.client.clone();
    let name = set.name_any();
    let now = ctx.now();
    let old = set.status.clone().unwrap_or_default();

    // Dereference the shared credentials (opt-in only).
    let mut invalid = None;
    let shared = match (&set.spec.credentials, shares_credentials(&set)) {
        (Some(c), true) => {
            let r = &c.secret_ref;
            let s = Api::<Secret>::namespaced(client.clone(), &r.namespace)
                .get_opt(&r.name)
                .await?;
            if s.is_none() {
                invalid = Some((
                    "CredentialsNotFound",
                    format!(
                        "the credentials Secret {}/{} (spec.credentials.secretRef) does not exist",
                        r.namespace, r.name
                    ),
                ));
            }
            s
        }
        _ => None,
    };
    let digest = shared
        .as_ref()
        .map(|s| credentials_digest(&set, &s.data.clone().unwrap_or_default()));

    let namespaces = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let selected = selected_namespaces(&set, &namespaces.items);
    let is_selected: HashSet<&str> = selected.iter().map(String::as_str).collect();

    // Objects with the names this set uses, in any namespace: its own, or someone else's.
    let sources = Api::<ArchiveSource>::all(client.clone())
        .list(&by_name(&name))
        .await?;
    let secrets = Api::<Secret>::all(client.clone());
    let copies = secrets.list_metadata(&by_name(&copy_name(&set))).await?;
    let per_ns_secret = per_namespace_secret(&set);
    let has_secret: HashSet<String> = match &per_ns_secret {
        Some(n) => secrets
            .list_metadata(&by_name(n))
            .await?
            .items
            .iter()
            .filter_map(|s| s.namespace())
            .collect(),
        None => HashSet::new(),
    };

    let mut problems: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut children: BTreeMap<String, ArchiveSource> = BTreeMap::new();
    for s in &sources.items {
        if owned_by(s, &set) {
            children.insert(s.namespace().unwrap_or_default(), s.clone());
        }
    }
    if invalid.is_none() {
        for ns in &selected {
            let existing = sources
                .items
                .iter()
                .find(|s| s.namespace().as_deref() == Some(ns));
            if existing.is_some_and(|s| !owned_by(s, &set)) {
                problems.insert(
                    ns.clone(),
                    problem(
                        "NameConflict",
                        format!("an ArchiveSource {ns}/{name} exists that this set does not own; rename or delete it"),
                    ),
                );
                continue;
            }
            if let Some(secret) = &shared {
                let copy = copy_name(&set);
                let theirs = copies
                    .items
                    .iter()
                    .any(|c| c.namespace().as_deref() == Some(ns) && !owned_by(c, &set));
                if theirs {
                    problems.insert(
                        ns.clone(),
                        problem(
                            "SecretConflict",
                            format!("a Secret {ns}/{copy} exists that this set does not own; the credentials are not copied over it (rename or delete it)"),
                        ),
                    );
                    continue;
                }
                let api = Api::<Secret>::namespaced(client.clone(), ns);
                if let Err(e) = apply(&api, &secret_copy(&set, ns, secret)).await {
                    problems.insert(
                        ns.clone(),
                        problem(
                            "CopyFailed",
                            format!("copying the credentials into Secret {ns}/{copy}: {e}"),
                        ),
                    );
                    continue;
                }
            }
            if let Some(n) = per_ns_secret.as_ref().filter(|_| !has_secret.contains(ns)) {
                problems.insert(
                    ns.clone(),
                    problem(
                        "SecretNotFound",
                        format!("template.spec.archive.s3.credentials names Secret {n}, which does not exist in namespace {ns}; create it there, or share a Secret with spec.credentials (shareToNamespaces: true)"),
                    ),
                );
                // Applied anyway: the engines start once the Secret is there.
            }
            let api = Api::<ArchiveSource>::namespaced(client.clone(), ns);
            match apply(&api, &child_source(&set, ns, digest.as_deref())).await {
                Ok(s) => {
                    children.insert(ns.clone(), s);
                }
                Err(e) => {
                    problems.insert(
                        ns.clone(),
                        problem(
                            "ApplyFailed",
                            format!("applying ArchiveSource {ns}/{name}: {e}"),
                        ),
                    );
                }
            }
        }
    }

    // What this set owns outside the selection goes (and the copies once sharing is off).
    for (ns, _) in children
        .iter()
        .filter(|(ns, _)| !is_selected.contains(ns.as_str()))
    {
        delete(&Api::<ArchiveSource>::namespaced(client.clone(), ns), &name).await?;
        tracing::info!(set = %name, namespace = %ns, "removed the ArchiveSource of a namespace no longer selected");
    }
    let sharing = shared.is_some() || (invalid.is_some() && shares_credentials(&set));
    for c in copies.items.iter().filter(|c| owned_by(*c, &set)) {
        let ns = c.namespace().unwrap_or_default();
        if !sharing || !is_selected.contains(ns.as_str()) {
            delete(
                &Api::<Secret>::namespaced(client.clone(), &ns),
                &c.name_any(),
            )
            .await?;
        }
    }

    let obs = SetObservation {
        invalid,
        namespaces: selected
            .iter()
            .map(|ns| {
                (
                    ns.clone(),
                    namespace_state(problems.remove(ns), children.get(ns)),
                )
            })
            .collect(),
    };
    let failing_namespaces = obs
        .failing()
        .into_iter()
        .take(MAX_FAILING)
        .map(|(ns, reason, message)| FailingNamespace {
            namespace: ns.into(),
            reason: reason.chars().take(1024).collect(),
            message: message.chars().take(MAX_MESSAGE).collect(),
        })
        .collect();
    let status = ArchiveSourceSetStatus {
        observed_generation: set.metadata.generation,
        conditions: conditions::merge(
            &old.conditions,
            &source_set_conditions(&obs),
            &SOURCE_SET_TYPES,
            now,
            set.metadata.generation,
        ),
        desired_namespaces: Some(selected.len() as i32),
        ready_namespaces: Some(obs.ready() as i32),
        failing_namespaces,
    };
    let events = transition_events(&old.conditions, &status.conditions);
    if set.status.as_ref() != Some(&status) {
        let body = json!({
            "apiVersion": ArchiveSourceSet::api_version(&()),
            "kind": ArchiveSourceSet::kind(&()),
            "status": status,
        });
        Api::<ArchiveSourceSet>::all(client.clone())
            .patch_status(
                &name,
                &PatchParams::apply(MANAGER_SOURCE_SET).force(),
                &Patch::Apply(&body),
            )
            .await?;
    }
    let reference = set.object_ref(&());
    for e in &events {
        if let Err(err) = ctx.recorder.publish(e, &reference).await {
            tracing::warn!(%err, set = %name, "could not publish event");
        }
    }
    // Children, namespaces and Secrets trigger reconciles; this is a safety net.
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// Sets a Secret matters to: the set whose copy it is, sets sharing it, sets whose template
/// names it per namespace.
pub fn sets_for_secret(
    sets: &Store<ArchiveSourceSet>,
    secret: &PartialObjectMeta<Secret>,
) -> Vec<ObjectRef<ArchiveSourceSet>> {
    if let Some(set) = secret.labels().get(LABEL_SOURCE_SET) {
        return vec![ObjectRef::new(set)];
    }
    let (ns, name) = (secret.namespace().unwrap_or_default(), secret.name_any());
    sets.state()
        .iter()
        .filter(|s| {
            let shared = s
                .spec
                .credentials
                .as_ref()
                .is_some_and(|c| c.secret_ref.namespace == ns && c.secret_ref.name == name);
            shared || per_namespace_secret(s).as_deref() == Some(name.as_str())
        })
        .map(|s| ObjectRef::from_obj(&**s))
        .collect()
}
