//! The ArchiveSourceSet controller: dereference the shared credentials and CA bundle → select
//! namespaces → per namespace copy the Secret and the CA ConfigMap (opt-in only) and apply the
//! ArchiveSource (server-side apply,
//! one field manager; objects of the same name it does not own are conflicts, never taken over)
//! → delete what it owns in namespaces that are no longer selected → roll the children's
//! conditions up into status.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};

use super::apply::{Applier, ChildSet};
use super::context::{Context, Error, MANAGER_SOURCE_SET, cache_ready};
use super::status::set_events;
use crate::operator::builders::source_set::{
    LABEL_SOURCE_SET, SharedDigests, ca_copy, ca_copy_name, child_source, config_map_digest,
    copy_name, credentials_digest, owned_by, owns, per_namespace_secret, secret_copy,
    selected_namespaces, shared_ca_name, shares_credentials, template_uses_shared_ca,
};
use crate::operator::conditions::{
    self, Problem, SOURCE_SET_TYPES, SetObservation, namespace_state, source_set_conditions,
};
use crate::operator::crd::archive_source::ArchiveSource;
use crate::operator::crd::archive_source_set::{
    ArchiveSourceSet, ArchiveSourceSetStatus, FailingNamespace,
};

const MAX_FAILING: usize = 64;
const MAX_MESSAGE: usize = 4096;

pub async fn reconcile(set: Arc<ArchiveSourceSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    if set.metadata.deletion_timestamp.is_some() {
        // Owner references: the garbage collector removes the children.
        return Ok(Action::await_change());
    }
    let applier = Applier::new(&ctx, "source-set", MANAGER_SOURCE_SET);
    let mut children = ChildSet::new(&applier, format!("{LABEL_SOURCE_SET}={}", set.name_any()));
    let mut round = SetRound::new(&set, &ctx);
    let shared = Shared {
        secret: round.dereference().await?,
        ca: round.dereference_ca().await?,
    };
    let observed = Observed::from_caches(&set, &ctx).await?;
    round.keep_selected(&mut children, &observed, &shared);
    if round.invalid.is_none() {
        for ns in &observed.selected {
            round
                .apply_namespace(&mut children, ns, &observed, &shared)
                .await?;
        }
    }
    round.prune(&mut children, &observed).await?;
    round.write_status(&applier, &observed.selected).await?;
    // Children, namespaces and Secrets trigger reconciles; this is a safety net.
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// What the set copies into every namespace (each only on its opt-in).
struct Shared {
    secret: Option<Secret>,
    ca: Option<ConfigMap>,
}

/// What the caches hold of the set's world: the selected namespaces and the objects with the
/// names the set uses (its labelled ArchiveSources, the Secrets' metadata: copies, and the
/// Secret the template names per namespace).
struct Observed {
    selected: Vec<String>,
    /// ArchiveSources of the set's name (labelled), by namespace.
    sources: BTreeMap<String, Arc<ArchiveSource>>,
    /// Secrets of the copy's name, by namespace.
    copies: BTreeMap<String, Arc<PartialObjectMeta<Secret>>>,
    /// Namespaces holding the Secret the template names.
    has_secret: HashSet<String>,
    /// CA bundle copies (the operator's labelled ConfigMaps of the copy's name), by namespace.
    ca_copies: BTreeMap<String, Arc<PartialObjectMeta<ConfigMap>>>,
}

impl Observed {
    async fn from_caches(set: &ArchiveSourceSet, ctx: &Context) -> Result<Self, Error> {
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
        Ok(Self {
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

/// One reconcile of a set: its findings per namespace, its children as they now are.
struct SetRound<'a> {
    set: &'a ArchiveSourceSet,
    ctx: &'a Context,
    /// The set itself cannot work (its credentials Secret is missing).
    invalid: Option<Problem>,
    /// Why a selected namespace has no working ArchiveSource, by namespace.
    problems: BTreeMap<String, Problem>,
    /// The set's ArchiveSources, by namespace (cached or just applied).
    children: BTreeMap<String, ArchiveSource>,
    /// The digests of the shared credentials and CA (roll the engines when they change).
    digests: SharedDigests,
}

impl<'a> SetRound<'a> {
    fn new(set: &'a ArchiveSourceSet, ctx: &'a Context) -> Self {
        Self {
            set,
            ctx,
            invalid: None,
            problems: BTreeMap::new(),
            children: BTreeMap::new(),
            digests: SharedDigests::default(),
        }
    }

    /// The shared credentials (opt-in only); a missing one makes the set invalid.
    async fn dereference(&mut self) -> Result<Option<Secret>, Error> {
        let Some(c) = self
            .set
            .spec
            .credentials
            .as_ref()
            .filter(|_| shares_credentials(self.set))
        else {
            return Ok(None);
        };
        let r = &c.secret_ref;
        let secret = Api::<Secret>::namespaced(self.ctx.client.clone(), &r.namespace)
            .get_opt(&r.name)
            .await
            .map_err(Error::Dereference)?;
        self.digests.credentials = secret
            .as_ref()
            .map(|s| credentials_digest(self.set, &s.data.clone().unwrap_or_default()));
        if secret.is_none() {
            self.invalid = Some(Problem::new(
                "CredentialsNotFound",
                format!(
                    "the credentials Secret {}/{} (spec.credentials.secretRef) does not exist",
                    r.namespace, r.name
                ),
            ));
        }
        Ok(secret)
    }

    /// The shared CA bundle ConfigMap (opt-in only); a missing one, or one the template does
    /// not name, makes the set invalid.
    async fn dereference_ca(&mut self) -> Result<Option<ConfigMap>, Error> {
        let Some(c) = self
            .set
            .spec
            .ca_bundle
            .as_ref()
            .filter(|c| c.share_to_namespaces)
        else {
            return Ok(None);
        };
        let r = &c.config_map_ref;
        if !template_uses_shared_ca(self.set) {
            self.invalid.get_or_insert_with(|| Problem::new(
                "CaBundleUnused",
                format!("spec.caBundle shares ConfigMap {}/{}, but no caBundle.configMap of the template (archive.s3, target.postgres) names {}", r.namespace, r.name, r.name),
            ));
            return Ok(None);
        }
        let cm = Api::<ConfigMap>::namespaced(self.ctx.client.clone(), &r.namespace)
            .get_opt(&r.name)
            .await
            .map_err(Error::Dereference)?;
        self.digests.ca = cm.as_ref().map(|c| config_map_digest(self.set, c));
        if cm.is_none() {
            self.invalid.get_or_insert_with(|| {
                Problem::new(
                    "CaBundleNotFound",
                    format!(
                        "the CA bundle ConfigMap {}/{} (spec.caBundle.configMapRef) does not exist",
                        r.namespace, r.name
                    ),
                )
            });
        }
        Ok(cm)
    }

    /// Every selected namespace keeps its ArchiveSource, and its credentials and CA copies
    /// while the set shares them (whether or not this round applies them); the rest is pruned.
    fn keep_selected(&mut self, children: &mut ChildSet<'_>, observed: &Observed, shared: &Shared) {
        self.children = observed
            .sources
            .iter()
            .filter(|(_, s)| owned_by(&***s, self.set))
            .map(|(ns, s)| (ns.clone(), (**s).clone()))
            .collect();
        // An invalid set keeps what it shares: running engines still use the copies.
        let invalid = self.invalid.is_some();
        let sharing = shared.secret.is_some() || (invalid && shares_credentials(self.set));
        let sharing_ca = shared.ca.is_some() || (invalid && shared_ca_name(self.set).is_some());
        let (name, copy, ca) = (
            self.set.name_any(),
            copy_name(self.set),
            ca_copy_name(self.set),
        );
        for ns in &observed.selected {
            children.keep::<ArchiveSource>(ns, &name);
            if sharing {
                children.keep::<Secret>(ns, &copy);
            }
            if sharing_ca {
                children.keep::<ConfigMap>(ns, &ca);
            }
        }
    }

    fn fail(&mut self, ns: &str, reason: &str, message: String) {
        self.problems
            .insert(ns.to_string(), Problem::new(reason, message));
    }

    /// Copies the Secret (opt-in only) and applies the ArchiveSource of one namespace; objects
    /// of the same names the set does not own are conflicts, never taken over.
    async fn apply_namespace(
        &mut self,
        children: &mut ChildSet<'_>,
        ns: &str,
        observed: &Observed,
        shared: &Shared,
    ) -> Result<(), Error> {
        let name = self.set.name_any();
        // Not cached (the cache holds only labelled ones): before creating, make sure no
        // ArchiveSource of that name exists that someone else made.
        let existing = match observed.sources.get(ns) {
            Some(s) => Some((**s).clone()),
            None => Api::<ArchiveSource>::namespaced(self.ctx.client.clone(), ns)
                .get_opt(&name)
                .await
                .map_err(Error::Apply)?,
        };
        if existing.as_ref().is_some_and(|s| !owned_by(s, self.set)) {
            self.fail(ns, "NameConflict", format!("an ArchiveSource {ns}/{name} exists that this set does not own; rename or delete it"));
            return Ok(());
        }
        if let Some(secret) = &shared.secret
            && !self.copy_secret(children, ns, observed, secret).await
        {
            return Ok(());
        }
        if let Some(ca) = &shared.ca
            && !self.copy_ca(children, ns, observed, ca).await?
        {
            return Ok(());
        }
        if let Some(n) =
            per_namespace_secret(self.set).filter(|_| !observed.has_secret.contains(ns))
        {
            // Applied anyway: the engines start once the Secret is there.
            self.fail(ns, "SecretNotFound", format!("template.spec.archive.s3.credentials names Secret {n}, which does not exist in namespace {ns}; create it there, or share a Secret with spec.credentials (shareToNamespaces: true)"));
        }
        let desired = child_source(self.set, ns, &self.digests);
        match children
            .apply_over(desired, existing.as_ref().map(|s| &s.metadata))
            .await
        {
            Ok(Some(s)) => {
                self.children.insert(ns.to_string(), s);
            }
            Ok(None) => {}
            Err(e) => self.fail(
                ns,
                "ApplyFailed",
                format!("applying ArchiveSource {ns}/{name}: {e}"),
            ),
        }
        Ok(())
    }

    /// Copies the shared credentials into `ns`; false (and a problem) when that failed or a
    /// Secret of the copy's name is someone else's.
    async fn copy_secret(
        &mut self,
        children: &mut ChildSet<'_>,
        ns: &str,
        observed: &Observed,
        secret: &Secret,
    ) -> bool {
        let copy = copy_name(self.set);
        let ours = observed.copies.get(ns);
        if ours.is_some_and(|c| !owned_by(&**c, self.set)) {
            self.fail(ns, "SecretConflict", format!("a Secret {ns}/{copy} exists that this set does not own; the credentials are not copied over it (rename or delete it)"));
            return false;
        }
        let desired = secret_copy(self.set, ns, secret);
        if let Err(e) = children
            .apply_over(desired, ours.map(|c| &c.metadata))
            .await
        {
            self.fail(
                ns,
                "CopyFailed",
                format!("copying the credentials into Secret {ns}/{copy}: {e}"),
            );
            return false;
        }
        true
    }

    /// Copies the shared CA bundle into `ns`; false (and a problem) when that failed or a
    /// ConfigMap of the copy's name is someone else's (the cache holds only labelled ones: one
    /// that is not cached is read before it is created).
    async fn copy_ca(
        &mut self,
        children: &mut ChildSet<'_>,
        ns: &str,
        observed: &Observed,
        ca: &ConfigMap,
    ) -> Result<bool, Error> {
        let copy = ca_copy_name(self.set);
        let existing = match observed.ca_copies.get(ns) {
            Some(c) => Some(c.metadata.clone()),
            None => Api::<ConfigMap>::namespaced(self.ctx.client.clone(), ns)
                .get_opt(&copy)
                .await
                .map_err(Error::Apply)?
                .map(|c| c.metadata),
        };
        if existing.as_ref().is_some_and(|m| !owns(m, self.set)) {
            self.fail(ns, "ConfigMapConflict", format!("a ConfigMap {ns}/{copy} exists that this set does not own; the CA bundle is not copied over it (rename or delete it)"));
            return Ok(false);
        }
        let desired = ca_copy(self.set, ns, ca);
        if let Err(e) = children.apply_over(desired, existing.as_ref()).await {
            self.fail(
                ns,
                "CopyFailed",
                format!("copying the CA bundle into ConfigMap {ns}/{copy}: {e}"),
            );
            return Ok(false);
        }
        Ok(true)
    }

    /// Deletes what the set owns outside the selection (and the copies once sharing is off).
    async fn prune(&self, children: &mut ChildSet<'_>, observed: &Observed) -> Result<(), Error> {
        let name = self.set.name_any();
        let sources = self
            .children
            .keys()
            .map(|ns| (ns.clone(), name.clone()))
            .collect();
        children.prune_among::<ArchiveSource>(sources).await?;
        let copies = observed
            .copies
            .iter()
            .filter(|(_, c)| owned_by(&***c, self.set))
            .map(|(ns, c)| (ns.clone(), c.name_any()))
            .collect();
        children.prune_among::<Secret>(copies).await?;
        let ca_copies = observed
            .ca_copies
            .iter()
            .filter(|(_, c)| owned_by(&***c, self.set))
            .map(|(ns, c)| (ns.clone(), c.name_any()))
            .collect();
        children.prune_among::<ConfigMap>(ca_copies).await?;
        Ok(())
    }

    /// The children's conditions rolled up into status (written only when changed), with
    /// Events on its conditions' transitions.
    async fn write_status(
        mut self,
        applier: &Applier<'_>,
        selected: &[String],
    ) -> Result<(), Error> {
        let obs = SetObservation {
            invalid: self.invalid.take(),
            namespaces: selected
                .iter()
                .map(|ns| {
                    let state = namespace_state(self.problems.remove(ns), self.children.get(ns));
                    (ns.clone(), state)
                })
                .collect(),
        };
        let old = self.set.status.clone().unwrap_or_default();
        let generation = self.set.metadata.generation;
        let status = ArchiveSourceSetStatus {
            observed_generation: generation,
            conditions: conditions::merge(
                &old.conditions,
                &source_set_conditions(&obs),
                &SOURCE_SET_TYPES,
                self.ctx.now(),
                generation,
            ),
            desired_namespaces: Some(selected.len() as i32),
            ready_namespaces: Some(obs.ready() as i32),
            failing_namespaces: failing_namespaces(&obs),
        };
        let events = set_events(&old.conditions, &status.conditions);
        applier
            .report(
                &Api::<ArchiveSourceSet>::all(self.ctx.client.clone()),
                self.set,
                self.set.status.as_ref(),
                &status,
                &events,
            )
            .await
    }
}

/// The failing namespaces for status, bounded in number and size.
fn failing_namespaces(obs: &SetObservation) -> Vec<FailingNamespace> {
    obs.failing()
        .into_iter()
        .take(MAX_FAILING)
        .map(|(ns, reason, message)| FailingNamespace {
            namespace: ns.into(),
            reason: reason.chars().take(1024).collect(),
            message: message.chars().take(MAX_MESSAGE).collect(),
        })
        .collect()
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
