//! The ArchiveSourceSet controller: dereference the shared credentials → select namespaces →
//! per namespace copy the Secret (opt-in only) and apply the ArchiveSource (server-side apply,
//! one field manager; objects of the same name it does not own are conflicts, never taken over)
//! → delete what it owns in namespaces that are no longer selected → roll the children's
//! conditions up into status.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};

use super::apply::Applier;
use super::context::{Context, Error, MANAGER_SOURCE_SET, cache_ready};
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
    let applier = Applier::new(&ctx, "source-set", MANAGER_SOURCE_SET);
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

    let caches = &ctx.caches;
    cache_ready(&caches.namespaces).await?;
    cache_ready(&caches.set_sources).await?;
    cache_ready(&caches.secrets).await?;
    let namespaces = caches.namespaces.state();
    let selected = selected_namespaces(&set, namespaces.iter().map(|n| &**n));
    let is_selected: HashSet<&str> = selected.iter().map(String::as_str).collect();

    // Objects with the names this set uses, from the caches: the labelled ArchiveSources, the
    // Secrets' metadata (copies, and the Secret the template names per namespace).
    let sources = caches
        .set_sources
        .state_filter(|s| s.name_any() == name)
        .into_iter()
        .map(|s| (s.namespace().unwrap_or_default(), s))
        .collect::<BTreeMap<_, _>>();
    let copy = copy_name(&set);
    let copies = caches
        .secrets
        .state_filter(|s| s.name_any() == copy)
        .into_iter()
        .map(|s| (s.namespace().unwrap_or_default(), s))
        .collect::<BTreeMap<_, _>>();
    let per_ns_secret = per_namespace_secret(&set);
    let has_secret: HashSet<String> = match &per_ns_secret {
        Some(n) => caches
            .secrets
            .state_filter(|s| &s.name_any() == n)
            .iter()
            .filter_map(|s| s.namespace())
            .collect(),
        None => HashSet::new(),
    };

    let mut problems: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut children: BTreeMap<String, ArchiveSource> = sources
        .iter()
        .filter(|(_, s)| owned_by(&***s, &set))
        .map(|(ns, s)| (ns.clone(), (**s).clone()))
        .collect();
    if invalid.is_none() {
        for ns in &selected {
            let api = Api::<ArchiveSource>::namespaced(client.clone(), ns);
            // Not cached (the cache holds only labelled ones): before creating, make sure no
            // ArchiveSource of that name exists that someone else made.
            let existing = match sources.get(ns) {
                Some(s) => Some((**s).clone()),
                None => api.get_opt(&name).await?,
            };
            if existing.as_ref().is_some_and(|s| !owned_by(s, &set)) {
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
                let ours = match copies.get(ns) {
                    Some(c) if !owned_by(&**c, &set) => {
                        problems.insert(
                            ns.clone(),
                            problem(
                                "SecretConflict",
                                format!("a Secret {ns}/{copy} exists that this set does not own; the credentials are not copied over it (rename or delete it)"),
                            ),
                        );
                        continue;
                    }
                    c => c,
                };
                let api = Api::<Secret>::namespaced(client.clone(), ns);
                let desired = secret_copy(&set, ns, secret);
                if let Err(e) = applier
                    .apply(&api, desired, ours.map(|c| &c.metadata))
                    .await
                {
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
            let desired = child_source(&set, ns, digest.as_deref());
            match applier
                .apply(&api, desired, existing.as_ref().map(|s| &s.metadata))
                .await
            {
                Ok(Some(s)) => {
                    children.insert(ns.clone(), s);
                }
                Ok(None) => {}
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
    for ns in children
        .keys()
        .filter(|ns| !is_selected.contains(ns.as_str()))
    {
        applier
            .delete(&Api::<ArchiveSource>::namespaced(client.clone(), ns), &name)
            .await?;
        tracing::info!(set = %name, namespace = %ns, "removed the ArchiveSource of a namespace no longer selected");
    }
    let sharing = shared.is_some() || (invalid.is_some() && shares_credentials(&set));
    for (ns, _) in copies.iter().filter(|(_, c)| owned_by(&***c, &set)) {
        if !sharing || !is_selected.contains(ns.as_str()) {
            applier
                .delete(&Api::<Secret>::namespaced(client.clone(), ns), &copy)
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
    applier
        .report(
            &Api::<ArchiveSourceSet>::all(client.clone()),
            &*set,
            set.status.as_ref(),
            &status,
            &events,
        )
        .await?;
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
