//! The ArchiveSourceSet controller, as steps that take and return values: dereference the
//! shared credentials and CA bundle → select namespaces → per namespace copy the Secret and the
//! CA ConfigMap (opt-in only) and apply the ArchiveSource or ArchiveRestore (server-side apply,
//! one field manager; objects of the same name it does not own are conflicts, never taken over)
//! → delete what it owns in namespaces that are no longer selected → roll the children's
//! conditions up into status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::events::Event;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::crd::archive_restore::ArchiveRestore;
use crate::crd::archive_source::ArchiveSource;
use crate::crd::archive_source_set::{
    ArchiveSourceSet, ArchiveSourceSetStatus, FailingNamespace, NamespaceRestore, RefreshPolicy,
};
use crate::reconcile::apply::{Applier, ChildSet, NamespacedChild};
use crate::reconcile::conditions::{self, Problem};
use crate::reconcile::context::{Context, Error, MANAGER_SOURCE_SET};
use crate::reconcile::status::set_events;
use crate::source_set::build::{
    LABEL_SOURCE_SET, SharedDigests, ca_copy, ca_copy_name, child_restore, child_source,
    config_map_digest, copy_name, credentials_digest, owned_by, owns, per_namespace_secret,
    refresh_token, secret_copy, shared_ca_name, shares_credentials, stamps_restores,
    template_uses_shared_ca, token_epoch,
};
use crate::source_set::conditions::{
    NamespaceState, SOURCE_SET_TYPES, SetObservation, namespace_state, restore_namespace_state,
    source_set_conditions,
};
use crate::source_set::observed::Observed;
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
    let round = Round {
        set: &set,
        ctx: &ctx,
        applier: &applier,
    };
    let shared = round.dereference().await?;
    let observed = Observed::from_caches(&set, &ctx).await?;
    let (head, requeue) = round.head_epoch(&shared, &observed).await?;
    let kept = round.keep_selected(&mut children, &observed, &shared);
    let applied = round.apply_selected(&mut children, &observed, &shared, &head);
    let owned = kept.with(applied.await?);
    round.prune(&mut children, &observed, &owned).await?;
    let (status, events) = status(&set, &observed.selected, &shared, owned, head, ctx.now());
    round.write_status(&status, &events).await?;
    // Children, namespaces and Secrets trigger reconciles; this is a safety net (and, with
    // OnNewEpoch, the poll of the archive's head).
    Ok(Action::requeue(requeue))
}

/// What the set copies into every namespace (each only on its opt-in), their digests (roll
/// the engines when they change), and why the set itself cannot work (a shared object is
/// missing or unused).
struct Shared {
    secret: Option<Secret>,
    ca: Option<ConfigMap>,
    digests: SharedDigests,
    invalid: Option<Problem>,
}

/// What one reconcile of a set works with; its steps change none of it.
struct Round<'a> {
    set: &'a ArchiveSourceSet,
    ctx: &'a Context,
    applier: &'a Applier<'a>,
}

/// The archive's head epoch (restoreTemplate with OnNewEpoch), as last read, and when it was
/// read (now, or the status's time when reused).
#[derive(Default)]
struct Head {
    epoch: Option<i64>,
    read: Option<String>,
}

/// The set's children as they now are, by namespace (cached or just applied), and why a
/// selected namespace has none that works.
struct Owned {
    sources: BTreeMap<String, ArchiveSource>,
    restores: BTreeMap<String, ArchiveRestore>,
    problems: BTreeMap<String, Problem>,
}

/// What applying one namespace came to: its child as applied (when something was sent), or
/// why it has none that works (a namespace's last problem is the one it reports).
#[derive(Default)]
struct NamespaceApplied {
    source: Option<ArchiveSource>,
    restore: Option<ArchiveRestore>,
    problem: Option<Problem>,
}

impl NamespaceApplied {
    fn failed(reason: &str, message: String) -> Self {
        Self {
            problem: Some(Problem::new(reason, message)),
            ..Self::default()
        }
    }
}

impl Owned {
    /// With what each namespace's apply came to.
    fn with(self, applied: Vec<(String, NamespaceApplied)>) -> Owned {
        let mut owned = self;
        for (ns, a) in applied {
            if let Some(s) = a.source {
                owned.sources.insert(ns.clone(), s);
            }
            if let Some(r) = a.restore {
                owned.restores.insert(ns.clone(), r);
            }
            if let Some(p) = a.problem {
                owned.problems.insert(ns, p);
            }
        }
        owned
    }
}

impl Round<'_> {
    /// With `refresh: OnNewEpoch`, the archive's head epoch: read from the store (one
    /// manifest a table) unless the last read is younger than [`HEAD_RECHECK`]. A failed read
    /// keeps the last epoch (nothing re-runs) and is logged. Returns it with the requeue.
    async fn head_epoch(
        &self,
        shared: &Shared,
        observed: &Observed,
    ) -> Result<(Head, Duration), Error> {
        let idle = Duration::from_secs(300);
        let Some(t) = self.set.spec.restore_template.as_ref().filter(|t| {
            t.refresh == Some(RefreshPolicy::OnNewEpoch) && self.set.spec.template.is_none()
        }) else {
            return Ok((Head::default(), idle));
        };
        let old = self.set.status.clone().unwrap_or_default();
        let last = Head {
            epoch: old.head_epoch,
            read: old.head_epoch_read_time.clone(),
        };
        if observed.selected.is_empty() {
            // Nothing to refresh: no store read.
            return Ok((last, idle));
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
            return Ok((last, HEAD_RECHECK));
        }
        let Some(s3) = t.spec.archive.s3.as_ref() else {
            return Ok((last, idle));
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
        let head = match tokio::time::timeout(Duration::from_secs(20), read).await {
            Ok(Ok(head)) => Head {
                epoch: head.or(last.epoch),
                read: Some(conditions::time_string(now)),
            },
            Ok(Err(e)) => {
                tracing::warn!(set = %self.set.name_any(), error = %e, "reading the seed archive's head epoch");
                last
            }
            Err(_) => {
                tracing::warn!(set = %self.set.name_any(), "reading the seed archive's head epoch timed out");
                last
            }
        };
        Ok((head, HEAD_RECHECK))
    }

    /// The shared credentials and CA bundle (each opt-in only), their digests, and why the set
    /// cannot work when one is missing (the credentials' problem first).
    async fn dereference(&self) -> Result<Shared, Error> {
        let (secret, credentials_problem) = self.dereference_credentials().await?;
        let (ca, ca_problem) = self.dereference_ca().await?;
        Ok(Shared {
            digests: SharedDigests {
                credentials: secret
                    .as_ref()
                    .map(|s| credentials_digest(self.set, &s.data.clone().unwrap_or_default())),
                ca: ca.as_ref().map(|c| config_map_digest(self.set, c)),
            },
            secret,
            ca,
            invalid: credentials_problem.or(ca_problem),
        })
    }

    /// The shared credentials (opt-in only); a missing one makes the set invalid.
    async fn dereference_credentials(&self) -> Result<(Option<Secret>, Option<Problem>), Error> {
        let Some(c) = self
            .set
            .spec
            .credentials
            .as_ref()
            .filter(|_| shares_credentials(self.set))
        else {
            return Ok((None, None));
        };
        let r = &c.secret_ref;
        let secret = Api::<Secret>::namespaced(self.ctx.client.clone(), &r.namespace)
            .get_opt(&r.name)
            .await
            .map_err(Error::Dereference)?;
        let problem = secret.is_none().then(|| {
            Problem::new(
                "CredentialsNotFound",
                format!(
                    "the credentials Secret {}/{} (spec.credentials.secretRef) does not exist",
                    r.namespace, r.name
                ),
            )
        });
        Ok((secret, problem))
    }

    /// The shared CA bundle ConfigMap (opt-in only); a missing one, or one the template does
    /// not name, makes the set invalid.
    async fn dereference_ca(&self) -> Result<(Option<ConfigMap>, Option<Problem>), Error> {
        let Some(c) = self
            .set
            .spec
            .ca_bundle
            .as_ref()
            .filter(|c| c.share_to_namespaces)
        else {
            return Ok((None, None));
        };
        let r = &c.config_map_ref;
        if !template_uses_shared_ca(self.set) {
            let problem = Problem::new(
                "CaBundleUnused",
                format!(
                    "spec.caBundle shares ConfigMap {}/{}, but no caBundle.configMap of the template (archive.s3, target.postgres) names {}",
                    r.namespace, r.name, r.name
                ),
            );
            return Ok((None, Some(problem)));
        }
        let cm = Api::<ConfigMap>::namespaced(self.ctx.client.clone(), &r.namespace)
            .get_opt(&r.name)
            .await
            .map_err(Error::Dereference)?;
        let problem = cm.is_none().then(|| {
            Problem::new(
                "CaBundleNotFound",
                format!(
                    "the CA bundle ConfigMap {}/{} (spec.caBundle.configMapRef) does not exist",
                    r.namespace, r.name
                ),
            )
        });
        Ok((cm, problem))
    }

    /// Every selected namespace keeps its ArchiveSource, and its credentials and CA copies
    /// while the set shares them (whether or not this round applies them); the rest is pruned.
    /// Returns the set's children the caches hold.
    fn keep_selected(
        &self,
        children: &mut ChildSet<'_>,
        observed: &Observed,
        shared: &Shared,
    ) -> Owned {
        // An invalid set keeps what it shares: running engines still use the copies.
        let invalid = shared.invalid.is_some();
        let sharing = shared.secret.is_some() || (invalid && shares_credentials(self.set));
        let sharing_ca = shared.ca.is_some() || (invalid && shared_ca_name(self.set).is_some());
        let (name, copy, ca) = (
            self.set.name_any(),
            copy_name(self.set),
            ca_copy_name(self.set),
        );
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
        Owned {
            sources: self.owned(&observed.sources),
            restores: self.owned(&observed.restores),
            problems: BTreeMap::new(),
        }
    }

    /// The objects among `cached` the set owns, by namespace.
    fn owned<K: kube::Resource + Clone>(
        &self,
        cached: &BTreeMap<String, Arc<K>>,
    ) -> BTreeMap<String, K> {
        cached
            .iter()
            .filter(|(_, c)| owned_by(&***c, self.set))
            .map(|(ns, c)| (ns.clone(), (**c).clone()))
            .collect()
    }

    /// Applies each selected namespace (none while the set is invalid): what each came to.
    async fn apply_selected(
        &self,
        children: &mut ChildSet<'_>,
        observed: &Observed,
        shared: &Shared,
        head: &Head,
    ) -> Result<Vec<(String, NamespaceApplied)>, Error> {
        let mut applied = vec![];
        if shared.invalid.is_none() {
            for ns in &observed.selected {
                let found = self.apply_namespace(children, ns, observed, shared, head);
                applied.push((ns.clone(), found.await?));
            }
        }
        Ok(applied)
    }

    /// Copies the Secret (opt-in only) and applies the ArchiveSource of one namespace; objects
    /// of the same names the set does not own are conflicts, never taken over.
    async fn apply_namespace(
        &self,
        children: &mut ChildSet<'_>,
        ns: &str,
        observed: &Observed,
        shared: &Shared,
        head: &Head,
    ) -> Result<NamespaceApplied, Error> {
        let name = self.set.name_any();
        if stamps_restores(self.set) {
            return self
                .apply_restore(children, ns, observed, shared, head)
                .await;
        }
        let existing = match self
            .own_child(ns, observed.sources.get(ns), children, observed, shared)
            .await?
        {
            Ok(existing) => existing,
            Err(problem) => return Ok(NamespaceApplied::failed(&problem.reason, problem.message)),
        };
        let secret_missing = per_namespace_secret(self.set)
            .filter(|_| !observed.has_secret.contains(ns))
            // Applied anyway: the engines start once the Secret is there.
            .map(|n| Problem::new("SecretNotFound", format!("template.spec.archive.s3.credentials names Secret {n}, which does not exist in namespace {ns}; create it there, or share a Secret with spec.credentials (shareToNamespaces: true)")));
        let desired = child_source(self.set, ns, &shared.digests);
        Ok(
            match children
                .apply_over(desired, existing.as_ref().map(|s| &s.metadata))
                .await
            {
                Ok(source) => NamespaceApplied {
                    source,
                    problem: secret_missing,
                    ..NamespaceApplied::default()
                },
                Err(e) => NamespaceApplied::failed(
                    "ApplyFailed",
                    format!("applying ArchiveSource {ns}/{name}: {e}"),
                ),
            },
        )
    }

    /// The copies, then the ArchiveRestore of one namespace, with the refresh token its
    /// policy asks for now.
    async fn apply_restore(
        &self,
        children: &mut ChildSet<'_>,
        ns: &str,
        observed: &Observed,
        shared: &Shared,
        head: &Head,
    ) -> Result<NamespaceApplied, Error> {
        let name = self.set.name_any();
        let existing = match self
            .own_child(ns, observed.restores.get(ns), children, observed, shared)
            .await?
        {
            Ok(existing) => existing,
            Err(problem) => return Ok(NamespaceApplied::failed(&problem.reason, problem.message)),
        };
        let token = refresh_token(self.set, head.epoch, existing.as_ref());
        let desired = child_restore(self.set, ns, &shared.digests, &token);
        Ok(
            match children
                .apply_over(desired, existing.as_ref().map(|r| &r.metadata))
                .await
            {
                // The applied object has no status yet: keep the observed one for the rollup.
                Ok(restore) => NamespaceApplied {
                    restore: restore.map(|r| ArchiveRestore {
                        status: existing.and_then(|e| e.status).or(r.status.clone()),
                        ..r
                    }),
                    ..NamespaceApplied::default()
                },
                Err(e) => NamespaceApplied::failed(
                    "ApplyFailed",
                    format!("applying ArchiveRestore {ns}/{name}: {e}"),
                ),
            },
        )
    }

    /// The set's child of kind `K` in `ns` as it is (`cached`: from the cache or the labelled
    /// list; one not there is read, in case someone else's has the name), after copying what
    /// the set shares; a problem when the name is someone else's or a copy failed.
    async fn own_child<K: NamespacedChild>(
        &self,
        ns: &str,
        cached: Option<&Arc<K>>,
        children: &mut ChildSet<'_>,
        observed: &Observed,
        shared: &Shared,
    ) -> Result<Result<Option<K>, Problem>, Error> {
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
            return Ok(Err(Problem::new(
                "NameConflict",
                format!(
                    "an {kind} {ns}/{name} exists that this set does not own; rename or delete it"
                ),
            )));
        }
        Ok(self
            .copy_shared(children, ns, observed, shared)
            .await?
            .map(|()| existing))
    }

    /// Copies what the set shares (opt-in only) into `ns`; a problem when a copy failed or
    /// would overwrite someone else's object.
    async fn copy_shared(
        &self,
        children: &mut ChildSet<'_>,
        ns: &str,
        observed: &Observed,
        shared: &Shared,
    ) -> Result<Result<(), Problem>, Error> {
        if let Some(secret) = &shared.secret
            && let Err(problem) = self.copy_secret(children, ns, observed, secret).await
        {
            return Ok(Err(problem));
        }
        match &shared.ca {
            Some(ca) => self.copy_ca(children, ns, observed, ca).await,
            None => Ok(Ok(())),
        }
    }

    /// Copies the shared credentials into `ns`; a problem when that failed or a Secret of
    /// the copy's name is someone else's.
    async fn copy_secret(
        &self,
        children: &mut ChildSet<'_>,
        ns: &str,
        observed: &Observed,
        secret: &Secret,
    ) -> Result<(), Problem> {
        let copy = copy_name(self.set);
        let ours = observed.copies.get(ns);
        if ours.is_some_and(|c| !owned_by(&**c, self.set)) {
            return Err(Problem::new(
                "SecretConflict",
                format!(
                    "a Secret {ns}/{copy} exists that this set does not own; the credentials are not copied over it (rename or delete it)"
                ),
            ));
        }
        let desired = secret_copy(self.set, ns, secret);
        children
            .apply_over(desired, ours.map(|c| &c.metadata))
            .await
            .map(drop)
            .map_err(|e| {
                Problem::new(
                    "CopyFailed",
                    format!("copying the credentials into Secret {ns}/{copy}: {e}"),
                )
            })
    }

    /// Copies the shared CA bundle into `ns`; a problem when that failed or a ConfigMap of the
    /// copy's name is someone else's (the cache holds only labelled ones: one that is not
    /// cached is read before it is created).
    async fn copy_ca(
        &self,
        children: &mut ChildSet<'_>,
        ns: &str,
        observed: &Observed,
        ca: &ConfigMap,
    ) -> Result<Result<(), Problem>, Error> {
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
            return Ok(Err(Problem::new(
                "ConfigMapConflict",
                format!(
                    "a ConfigMap {ns}/{copy} exists that this set does not own; the CA bundle is not copied over it (rename or delete it)"
                ),
            )));
        }
        let desired = ca_copy(self.set, ns, ca);
        Ok(children
            .apply_over(desired, existing.as_ref())
            .await
            .map(drop)
            .map_err(|e| {
                Problem::new(
                    "CopyFailed",
                    format!("copying the CA bundle into ConfigMap {ns}/{copy}: {e}"),
                )
            }))
    }

    /// Deletes what the set owns outside the selection (and the copies once sharing is off).
    async fn prune(
        &self,
        children: &mut ChildSet<'_>,
        observed: &Observed,
        owned: &Owned,
    ) -> Result<(), Error> {
        let name = self.set.name_any();
        let sources = owned
            .sources
            .keys()
            .map(|ns| (ns.clone(), name.clone()))
            .collect();
        children.prune_among::<ArchiveSource>(sources).await?;
        // A restore leaves with its namespace; the database it filled is not touched.
        let restores = owned
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

    /// Status (only when changed), with Events on its conditions' transitions.
    async fn write_status(
        &self,
        status: &ArchiveSourceSetStatus,
        events: &[Event],
    ) -> Result<(), Error> {
        self.applier
            .report(
                &Api::<ArchiveSourceSet>::all(self.ctx.client.clone()),
                self.set,
                self.set.status.as_ref(),
                status,
                events,
            )
            .await
    }
}

/// The children's conditions rolled up into status, and Events on its conditions'
/// transitions.
fn status(
    set: &ArchiveSourceSet,
    selected: &[String],
    shared: &Shared,
    owned: Owned,
    head: Head,
    now: jiff::Timestamp,
) -> (ArchiveSourceSetStatus, Vec<Event>) {
    let Owned {
        sources,
        restores,
        mut problems,
    } = owned;
    let obs = SetObservation {
        invalid: shared.invalid.clone(),
        namespaces: selected
            .iter()
            .map(|ns| {
                let problem = problems.remove(ns);
                let state = if stamps_restores(set) {
                    restore_namespace_state(problem, restores.get(ns))
                } else {
                    namespace_state(problem, sources.get(ns))
                };
                (ns.clone(), state)
            })
            .collect(),
    };
    let old = set.status.clone().unwrap_or_default();
    let restores = if stamps_restores(set) {
        namespace_restores(&obs, &restores, &old.restores)
    } else {
        vec![]
    };
    let generation = set.metadata.generation;
    let status = ArchiveSourceSetStatus {
        observed_generation: generation,
        conditions: conditions::merge(
            &old.conditions,
            &source_set_conditions(&obs),
            &SOURCE_SET_TYPES,
            now,
            generation,
        ),
        desired_namespaces: Some(selected.len() as i32),
        ready_namespaces: Some(obs.ready() as i32),
        failing_namespaces: failing_namespaces(&obs),
        head_epoch: head.epoch,
        head_epoch_read_time: head.read,
        restores,
    };
    let events = set_events(&old.conditions, &status.conditions);
    (status, events)
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
