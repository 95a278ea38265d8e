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
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::crd::archive_restore::ArchiveRestore;
use crate::crd::archive_source::ArchiveSource;
use crate::crd::archive_source_set::{
    ArchiveSourceSet, ArchiveSourceSetStatus, FailingNamespace, NamespaceRestore, RefreshPolicy,
};
use crate::reconcile::apply::{Applier, ChildSet, NamespacedChild};
use crate::reconcile::conditions::{self, Problem};
use crate::reconcile::context::{Context, Error, MANAGER_SOURCE_SET, cache_ready};
use crate::reconcile::status::set_events;
use crate::source_set::build::{
    LABEL_SOURCE_SET, SharedDigests, ca_copy, ca_copy_name, child_restore, child_source,
    config_map_digest, copy_name, credentials_digest, owned_by, owns, per_namespace_secret,
    refresh_token, secret_copy, selected_namespaces, shared_ca_name, shares_credentials,
    stamps_restores, template_uses_shared_ca, token_epoch,
};
use crate::source_set::conditions::{
    NamespaceState, SOURCE_SET_TYPES, SetObservation, namespace_state, restore_namespace_state,
    source_set_conditions,
};
use crate::source_set::seed_head;

const MAX_FAILING: usize = 64;
const MAX_MESSAGE: usize = 4096;
/// Namespaces listed in `status.restores` (failing first, then by name).
const MAX_RESTORES: usize = 100;
/// How often a set with `refresh: OnNewEpoch` reads its archive's head (nothing else tells the
/// operator of a new epoch); a reconcile sooner than this after a read reuses it.
pub const HEAD_RECHECK: Duration = Duration::from_secs(30);

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
    let requeue = round.head_epoch(&shared, &observed).await?;
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
    // Children, namespaces and Secrets trigger reconciles; this is a safety net (and, with
    // OnNewEpoch, the poll of the archive's head).
    Ok(Action::requeue(requeue))
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
    /// With a restoreTemplate: the set's ArchiveRestores (one labelled list a reconcile), by
    /// namespace.
    restores: BTreeMap<String, Arc<ArchiveRestore>>,
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
    /// The set's ArchiveRestores, by namespace (listed or just applied).
    restores: BTreeMap<String, ArchiveRestore>,
    /// The archive's head epoch (restoreTemplate with OnNewEpoch), as last read.
    head: Option<i64>,
    /// When `head` was read (now, or the status's time when reused).
    head_read: Option<String>,
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
            restores: BTreeMap::new(),
            head: None,
            head_read: None,
        }
    }

    /// With `refresh: OnNewEpoch`, the archive's head epoch: read from the store (one
    /// manifest a table) unless the last read is younger than [`HEAD_RECHECK`]. A failed read
    /// keeps the last epoch (nothing re-runs) and is logged. Returns the requeue.
    async fn head_epoch(
        &mut self,
        shared: &Shared,
        observed: &Observed,
    ) -> Result<Duration, Error> {
        let idle = Duration::from_secs(300);
        let Some(t) = self.set.spec.restore_template.as_ref().filter(|t| {
            t.refresh == Some(RefreshPolicy::OnNewEpoch) && self.set.spec.template.is_none()
        }) else {
            return Ok(idle);
        };
        let old = self.set.status.clone().unwrap_or_default();
        self.head = old.head_epoch;
        self.head_read = old.head_epoch_read_time.clone();
        if observed.selected.is_empty() {
            // Nothing to refresh: no store read.
            return Ok(idle);
        }
        let now = self.ctx.now();
        let fresh = old
            .head_epoch_read_time
            .as_deref()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .is_some_and(|t| {
                now.duration_since(t).as_secs() < HEAD_RECHECK.as_secs() as i64 && now >= t
            });
        if fresh {
            return Ok(HEAD_RECHECK);
        }
        let Some(s3) = t.spec.archive.s3.as_ref() else {
            return Ok(idle);
        };
        // Only the credentials the set shares (opt-in): never a Secret of a selected
        // namespace, which is the tenant's; without sharing, the operator's own identity.
        let secret = shared.secret.as_ref().and_then(|s| s.data.clone());
        let probe = ArchiveRestore::new(&self.set.name_any(), t.spec.clone());
        let read = async {
            let archive = crate::restore::build::resolve(&probe, None)?;
            let keys = seed_head::manifest_keys(&archive);
            let config = seed_head::s3_config(s3, secret.as_ref())?;
            let store = larch_archive::store::s3::S3Store::new(config)
                .await
                .map_err(|e| e.to_string())?;
            seed_head::read_head_epoch(&store, &keys).await
        };
        match tokio::time::timeout(Duration::from_secs(20), read).await {
            Ok(Ok(head)) => {
                self.head = head.or(self.head);
                self.head_read = Some(conditions::time_string(now));
            }
            Ok(Err(e)) => {
                tracing::warn!(set = %self.set.name_any(), error = %e, "reading the seed archive's head epoch")
            }
            Err(_) => {
                tracing::warn!(set = %self.set.name_any(), "reading the seed archive's head epoch timed out")
            }
        }
        Ok(HEAD_RECHECK)
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
        self.restores = observed
            .restores
            .iter()
            .filter(|(_, r)| owned_by(&***r, self.set))
            .map(|(ns, r)| (ns.clone(), (**r).clone()))
            .collect();
        let restores = stamps_restores(self.set);
        for ns in &observed.selected {
            if restores {
                children.keep::<ArchiveRestore>(ns, &name);
            } else {
                children.keep::<ArchiveSource>(ns, &name);
            }
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
        if stamps_restores(self.set) {
            return self.apply_restore(children, ns, observed, shared).await;
        }
        let Some(existing) = self
            .own_child(ns, observed.sources.get(ns), children, observed, shared)
            .await?
        else {
            return Ok(());
        };
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

    /// The copies, then the ArchiveRestore of one namespace, with the refresh token its
    /// policy asks for now.
    async fn apply_restore(
        &mut self,
        children: &mut ChildSet<'_>,
        ns: &str,
        observed: &Observed,
        shared: &Shared,
    ) -> Result<(), Error> {
        let name = self.set.name_any();
        let Some(existing) = self
            .own_child(ns, observed.restores.get(ns), children, observed, shared)
            .await?
        else {
            return Ok(());
        };
        let token = refresh_token(self.set, self.head, existing.as_ref());
        let desired = child_restore(self.set, ns, &self.digests, &token);
        match children
            .apply_over(desired, existing.as_ref().map(|r| &r.metadata))
            .await
        {
            Ok(Some(r)) => {
                // The applied object has no status yet: keep the observed one for the rollup.
                let mut r = r;
                r.status = existing.and_then(|e| e.status).or(r.status);
                self.restores.insert(ns.to_string(), r);
            }
            Ok(None) => {}
            Err(e) => self.fail(
                ns,
                "ApplyFailed",
                format!("applying ArchiveRestore {ns}/{name}: {e}"),
            ),
        }
        Ok(())
    }

    /// The set's child of kind `K` in `ns` as it is (`cached`: from the cache or the labelled
    /// list; one not there is read, in case someone else's has the name), after copying what
    /// the set shares; `None` (and a problem) when the name is someone else's or a copy failed.
    async fn own_child<K: NamespacedChild>(
        &mut self,
        ns: &str,
        cached: Option<&Arc<K>>,
        children: &mut ChildSet<'_>,
        observed: &Observed,
        shared: &Shared,
    ) -> Result<Option<Option<K>>, Error> {
        let name = self.set.name_any();
        let existing = match cached {
            Some(c) => Some((**c).clone()),
            None => Api::<K>::namespaced(self.ctx.client.clone(), ns)
                .get_opt(&name)
                .await
                .map_err(Error::Apply)?,
        };
        if existing.as_ref().is_some_and(|c| !owned_by(c, self.set)) {
            let kind = K::kind(&());
            self.fail(
                ns,
                "NameConflict",
                format!(
                    "an {kind} {ns}/{name} exists that this set does not own; rename or delete it"
                ),
            );
            return Ok(None);
        }
        if !self.copy_shared(children, ns, observed, shared).await? {
            return Ok(None);
        }
        Ok(Some(existing))
    }

    /// Copies what the set shares (opt-in only) into `ns`; false (and a problem) when a copy
    /// failed or would overwrite someone else's object.
    async fn copy_shared(
        &mut self,
        children: &mut ChildSet<'_>,
        ns: &str,
        observed: &Observed,
        shared: &Shared,
    ) -> Result<bool, Error> {
        if let Some(secret) = &shared.secret
            && !self.copy_secret(children, ns, observed, secret).await
        {
            return Ok(false);
        }
        if let Some(ca) = &shared.ca
            && !self.copy_ca(children, ns, observed, ca).await?
        {
            return Ok(false);
        }
        Ok(true)
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
        // A restore leaves with its namespace; the database it filled is not touched.
        let restores = self
            .restores
            .keys()
            .map(|ns| (ns.clone(), name.clone()))
            .collect();
        children.prune_among::<ArchiveRestore>(restores).await?;
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
                    let problem = self.problems.remove(ns);
                    let state = if stamps_restores(self.set) {
                        restore_namespace_state(problem, self.restores.get(ns))
                    } else {
                        namespace_state(problem, self.children.get(ns))
                    };
                    (ns.clone(), state)
                })
                .collect(),
        };
        let restores = if stamps_restores(self.set) {
            namespace_restores(
                &obs,
                &self.restores,
                &self.set.status.clone().unwrap_or_default().restores,
            )
        } else {
            vec![]
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
            head_epoch: self.head,
            head_epoch_read_time: self.head_read.clone(),
            restores,
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

/// Each selected namespace's last refresh, from its ArchiveRestore's status (what a running
/// or failing run replaced is kept from the set's `previous` status), failing namespaces first,
/// at most [`MAX_RESTORES`].
fn namespace_restores(
    obs: &SetObservation,
    restores: &BTreeMap<String, ArchiveRestore>,
    previous: &[NamespaceRestore],
) -> Vec<NamespaceRestore> {
    let mut out: Vec<(bool, NamespaceRestore)> = obs
        .namespaces
        .iter()
        .map(|(ns, state)| {
            let mut entry = previous
                .iter()
                .find(|p| &p.namespace == ns)
                .cloned()
                .unwrap_or_else(|| NamespaceRestore {
                    namespace: ns.clone(),
                    ..Default::default()
                });
            let status = restores.get(ns).and_then(|r| r.status.clone());
            let run = status.as_ref().and_then(|s| s.run.clone());
            entry.refresh = run.as_ref().and_then(|r| r.token.clone()).or(entry.refresh);
            if let (Some(s), Some(run)) = (&status, &run)
                && run.succeeded == Some(true)
            {
                entry.last_refresh_time = run.completion_time.clone();
                entry.epoch = run.token.as_deref().and_then(token_epoch);
                entry.rows = Some(s.tables.iter().map(|t| t.rows).sum());
                entry.duration_seconds = s.duration_seconds;
            }
            let failing = match state {
                NamespaceState::Failing { reason, message } => {
                    entry.failure_reason = Some(reason.chars().take(64).collect());
                    entry.failure_message = Some(message.chars().take(1024).collect());
                    true
                }
                _ => {
                    entry.failure_reason = None;
                    entry.failure_message = None;
                    false
                }
            };
            (!failing, entry)
        })
        .collect();
    // Failing first (false < true), then by name (the selection is sorted; the sort is stable).
    out.sort_by_key(|(ok, _)| *ok);
    out.into_iter().take(MAX_RESTORES).map(|(_, e)| e).collect()
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

#[cfg(test)]
#[path = "tests/reconcile.rs"]
mod tests;
