//! The ArchiveSource controller: dereference (`exportRef`, the Secrets, keys and CA bundles
//! the engines mount) → validate → build → apply (server-side apply, one field manager; a
//! refused child is a condition) → observe (StatefulSet, engine pods' failures, engines'
//! `/status`) → status, with Events on failure and re-baseline transitions.

use larch_core::locks::MutexExt;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::controller::Action;

use crate::builders::LABEL_SOURCE;
use crate::builders::engine_config::{ResolvedArchive, resolve, source_id};
use crate::crd::archive_export::ArchiveExport;
use crate::crd::archive_source::{ArchiveSource, ArchiveSourceStatus, RebaselineStatus};
use crate::reconcile::apply::{Applier, ChildSet};
use crate::reconcile::conditions::{self, Problem, time_string};
use crate::reconcile::context::{Context, Error, MANAGER_SOURCE, cache_ready};
use crate::reconcile::dereference::{self, Missing};
use crate::reconcile::pod_failure;
use crate::reconcile::progress;
use crate::reconcile::status::source_events;
use crate::source::conditions::{
    DEFAULT_MAX_REBASELINES_PER_HOUR, SOURCE_TYPES, SourceObservation, source_conditions,
};
use crate::source::dereference::source_references;
use crate::source::observe::{self, EngineSource};
use crate::source::rebaseline::{RebaselineSample, RebaselineTracker};
use crate::source::validate;
use crate::source::{build, engine_token};
use larch_archive::position::Lsn;
use larch_core::progress::ProgressReport;

/// The message of the latest `FailedCreate` event of this StatefulSet (same uid), if any.
async fn failed_create(
    client: &kube::Client,
    ns: &str,
    sts: &StatefulSet,
) -> Result<Option<String>, Error> {
    let events = Api::<CoreEvent>::namespaced(client.clone(), ns)
        .list(&ListParams::default().fields(&format!(
            "involvedObject.kind=StatefulSet,involvedObject.name={},reason=FailedCreate",
            sts.name_any()
        )))
        .await
        .map_err(Error::Observe)?;
    Ok(events
        .items
        .into_iter()
        .filter(|e| e.involved_object.uid.is_some() && e.involved_object.uid == sts.uid())
        .max_by_key(|e| {
            e.last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or(e.event_time.as_ref().map(|t| t.0))
        })
        .and_then(|e| e.message))
}

pub async fn reconcile(source: Arc<ArchiveSource>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = source.namespace().ok_or(Error::NoNamespace)?;
    let applier = Applier::new(&ctx, "source", MANAGER_SOURCE);
    let mut round = SourceRound::new(&source, &ctx, ns);
    // Nothing is built while something is missing or the spec cannot work. The ArchiveExport
    // watch brings an export that appears; Secrets and ConfigMaps are looked at again after
    // RECHECK.
    let export = round.dereference().await?;
    if let Some(archive) = round.validate(export.as_ref()) {
        let applied = round.build_and_apply(&applier, &archive).await;
        if let Some(sts) = round.settle(applied)? {
            round.observe_stateful_set(&sts).await?;
            round.observe_engines().await?;
        }
    }
    round.conditions();
    round.write_status(&applier).await?;
    Ok(Action::requeue(round.requeue))
}

/// One reconcile of a source: what it observed, the status it will write.
struct SourceRound<'a> {
    source: &'a ArchiveSource,
    ctx: &'a Context,
    ns: String,
    now: Timestamp,
    old: ArchiveSourceStatus,
    status: ArchiveSourceStatus,
    obs: SourceObservation,
    requeue: Duration,
}

impl<'a> SourceRound<'a> {
    fn new(source: &'a ArchiveSource, ctx: &'a Context, ns: String) -> Self {
        let old = source.status.clone().unwrap_or_default();
        let suspended = source.spec.suspend == Some(true);
        let obs = SourceObservation {
            blocked: None,
            pod_failure: None,
            suspended,
            desired_replicas: if suspended {
                0
            } else {
                source.spec.replicas.unwrap_or(1)
            },
            ready_replicas: 0,
            rolled_out: false,
            pods_not_created: None,
            engines: vec![],
            rebaselining: false,
            rebaselines_last_hour: 0,
            max_per_hour: source
                .spec
                .rebaseline
                .as_ref()
                .and_then(|r| r.max_per_hour)
                .map(|m| m as u64)
                .unwrap_or(DEFAULT_MAX_REBASELINES_PER_HOUR),
        };
        Self {
            source,
            ctx,
            ns,
            now: ctx.now(),
            status: ArchiveSourceStatus {
                observed_generation: source.metadata.generation,
                ..old.clone()
            },
            old,
            obs,
            // Engines are polled for lag and re-baselines.
            requeue: Duration::from_secs(30),
        }
    }

    fn api<K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>>(&self) -> Api<K>
    where
        K::DynamicType: Default,
    {
        Api::namespaced(self.ctx.client.clone(), &self.ns)
    }

    fn block(&mut self, reason: &str, message: String) {
        self.obs.blocked = Some(Problem::new(reason, message));
    }

    /// The export (`exportRef`), then what the engines mount; returns the export.
    async fn dereference(&mut self) -> Result<Option<ArchiveExport>, Error> {
        let export = match &self.source.spec.archive.export_ref {
            Some(r) => self
                .api::<ArchiveExport>()
                .get_opt(&r.name)
                .await
                .map_err(Error::Dereference)?,
            None => None,
        };
        let missing = match (&self.source.spec.archive.export_ref, &export) {
            (Some(r), None) => Some(Missing::Export {
                name: r.name.clone(),
            }),
            _ => {
                let references = source_references(self.source, export.as_ref());
                let missing = dereference::check(&self.ctx.client, &self.ns, &references)
                    .await
                    .map_err(Error::Dereference)?;
                if missing.is_some() {
                    self.requeue = dereference::RECHECK;
                }
                missing
            }
        };
        if let Some(missing) = missing {
            self.block(missing.reason(), missing.message(&self.ns));
        }
        Ok(export)
    }

    /// What the schema cannot check, then the archive the engines read; `None`: blocked.
    fn validate(&mut self, export: Option<&ArchiveExport>) -> Option<ResolvedArchive> {
        if self.obs.blocked.is_some() {
            return None;
        }
        let checked = validate::source(self.source)
            .and_then(|()| self.token_available())
            .and_then(|()| resolve(self.source, export));
        match checked {
            Ok(archive) => Some(archive),
            Err(message) => {
                self.block("InvalidSpec", message);
                None
            }
        }
    }

    /// `control` and `protectReads` need a token: named, or generated by this operator.
    fn token_available(&self) -> Result<(), String> {
        let access = self.source.spec.access.clone().unwrap_or_default();
        let wants = access.control == Some(true) || access.protect_reads == Some(true);
        if wants && engine_token::token_ref(self.source, &self.ctx.build).is_none() {
            return Err("spec.access.control and spec.access.protectReads need a token, and this operator generates none (--no-generated-engine-tokens): name one in spec.access.tokenSecretRef".into());
        }
        Ok(())
    }

    /// The generated token's Secret, created when missing and never changed: an existing
    /// Secret of its name is kept as it is (the operator holds `create` on Secrets, not `get`).
    async fn ensure_token_secret(&self) -> Result<(), Error> {
        if !engine_token::generates_token(self.source, &self.ctx.build) {
            return Ok(());
        }
        let params = PostParams {
            field_manager: Some(MANAGER_SOURCE.into()),
            ..Default::default()
        };
        let secret = engine_token::engine_token_secret(self.source);
        match self.api::<Secret>().create(&params, &secret).await {
            Ok(_) => {
                // The name only: the value is never logged.
                tracing::info!(namespace = %self.ns, secret = %engine_token::engine_token_secret_name(self.source), "generated the engines' API token");
                Ok(())
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(Error::Apply(e)),
        }
    }

    /// Builds and applies the engines' ConfigMap, Service and StatefulSet (compared against
    /// the caches); returns the StatefulSet as it now is.
    async fn build_and_apply(
        &self,
        applier: &Applier<'_>,
        archive: &ResolvedArchive,
    ) -> Result<StatefulSet, Error> {
        let caches = &self.ctx.caches;
        cache_ready(&caches.config_maps).await?;
        cache_ready(&caches.services).await?;
        cache_ready(&caches.stateful_sets).await?;
        self.ensure_token_secret().await?;
        let children = build::children(self.source, archive, &self.ctx.build);
        let mut set = ChildSet::new(
            applier,
            format!("{LABEL_SOURCE}={}", self.source.name_any()),
        );
        set.apply_cached(children.config_map, &caches.config_maps)
            .await?;
        set.apply_cached(children.service, &caches.services).await?;
        // Optional children: applied when wanted, deleted when not.
        let name = self.source.name_any();
        applier
            .apply_or_prune(&self.api::<NetworkPolicy>(), &name, children.network_policy)
            .await?;
        applier
            .apply_or_prune(
                &self.api::<PodDisruptionBudget>(),
                &name,
                children.pod_disruption_budget,
            )
            .await?;
        match set
            .apply_cached(children.stateful_set, &caches.stateful_sets)
            .await?
        {
            (Some(applied), _) => Ok(applied),
            (None, Some(cached)) => Ok((*cached).clone()),
            (None, None) => unreachable!("an apply is skipped only for an observed object"),
        }
    }

    /// A child the API server refused is a condition; returns the StatefulSet otherwise.
    fn settle(
        &mut self,
        applied: Result<StatefulSet, Error>,
    ) -> Result<Option<StatefulSet>, Error> {
        match applied {
            Ok(sts) => Ok(Some(sts)),
            Err(Error::Rejected(r)) => {
                self.block("ChildRejected", r.to_string());
                self.requeue = Duration::from_secs(60);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Replicas ready and rolled out; too few pods: why the StatefulSet controller could not
    /// create one.
    async fn observe_stateful_set(&mut self, sts: &StatefulSet) -> Result<(), Error> {
        let desired = self.obs.desired_replicas;
        let st = sts.status.clone().unwrap_or_default();
        self.obs.ready_replicas = st.ready_replicas.unwrap_or(0);
        self.obs.rolled_out = st.observed_generation.unwrap_or(0)
            >= sts.metadata.generation.unwrap_or(0)
            && st.updated_replicas.unwrap_or(0) >= desired
            && st.replicas <= desired;
        self.status.ready_replicas = Some(self.obs.ready_replicas);
        if !self.obs.suspended && sts.status.is_some() && st.replicas < desired {
            self.obs.pods_not_created = failed_create(&self.ctx.client, &self.ns, sts).await?;
        }
        Ok(())
    }

    /// The engines' pods, `/status`: failures, positions, lag, re-baselines.
    async fn observe_engines(&mut self) -> Result<(), Error> {
        let name = self.source.name_any();
        let listed = self
            .api::<Pod>()
            .list(&ListParams::default().labels(&format!("{LABEL_SOURCE}={name}")))
            .await
            .map_err(Error::Observe)?;
        // Only the engines' own pods, never one that just carries the label.
        let uid = self.source.uid().unwrap_or_default();
        let pods =
            crate::reconcile::owned::owned_pods(&self.ctx.client, &self.ns, &uid, listed.items)
                .await
                .map_err(Error::Observe)?;
        if !self.obs.suspended {
            self.obs.pod_failure = pod_failure::first_failure(&pods, build::CONTAINER, self.now)
                .map(|f| Problem::of_pod("engine", &f));
        }
        let scrape = scrape_engines(self.ctx, self.source, &self.tracker_key(), &pods).await;
        self.track_rebaselines(&scrape.rebaselines);
        let engines = &scrape.engines;
        self.status.position = engines
            .iter()
            .filter_map(|e| e.position.clone())
            .min_by_key(|p| Lsn::parse(p).unwrap_or_default());
        self.status.head = engines
            .iter()
            .filter_map(|e| e.head.clone())
            .max_by_key(|p| Lsn::parse(p).unwrap_or_default());
        // The time of the head, not its age: status changes when the head does, never by
        // itself (kubectl shows the age in the DATA AGE column).
        self.status.head_time = engines.iter().filter_map(|e| e.head_time.clone()).max();
        // Pinned at a point: every engine resolves it alike; the first that has says where.
        self.status.restored = engines
            .iter()
            .filter_map(|e| e.at.clone())
            .find(|a| a.position.is_some());
        self.status.rows = scrape
            .rows
            .or_else(|| engines.iter().filter_map(|e| e.rows).max());
        self.observe_lag_and_progress(&scrape);
        self.obs.engines = scrape.engines;
        let labels = [self.ns.as_str(), name.as_str()];
        let metrics = &self.ctx.metrics;
        // The lag behind the head, not the head's age (which grows on an idle archive).
        metrics
            .source_lag
            .with_label_values(&labels)
            .set(self.status.lag.as_ref().map_or(0.0, |l| l.seconds as f64));
        metrics
            .source_rebaselines_last_hour
            .with_label_values(&labels)
            .set(self.obs.rebaselines_last_hour as f64);
        Ok(())
    }

    /// `status.lag` from the engines' `behind` (the furthest), and `status.progress` from their
    /// baseline loads (the engine furthest behind; while none answers, what was last seen).
    /// Comes back every [`progress::REQUEUE_WHILE_RUNNING`] while a load runs.
    fn observe_lag_and_progress(&mut self, scrape: &EngineScrape) {
        let behind: Vec<_> = scrape.engines.iter().filter_map(|e| e.behind).collect();
        self.status.lag = progress::source_lag(&behind);
        let new = if scrape.progress.is_empty() {
            self.old.progress.clone()
        } else {
            progress::source_progress(&scrape.progress)
        };
        if progress::is_running(new.as_ref()) {
            self.requeue = self.requeue.min(progress::REQUEUE_WHILE_RUNNING);
        }
        self.status.progress = progress::stamp(self.old.progress.as_ref(), new, self.now);
    }

    /// The re-baseline tracker's key: `namespace/name`.
    fn tracker_key(&self) -> String {
        format!("{}/{}", self.ns, self.source.name_any())
    }

    /// Feeds the engines' re-baseline counters to the tracker (resumed from status after a
    /// restart) and reads back whether one is under way and how many the last hour saw.
    fn track_rebaselines(&mut self, samples: &[RebaselineSample]) {
        let now = self.now;
        let tracker = {
            let mut trackers = self.ctx.trackers.locked();
            let t = trackers.entry(self.tracker_key()).or_insert_with(|| {
                let r = self.old.rebaselines.clone().unwrap_or_default();
                RebaselineTracker::resume(r.total, r.last_time.and_then(|t| t.parse().ok()))
            });
            t.observe(now, samples);
            t.clone()
        };
        self.obs.rebaselining = tracker.recent(now);
        self.obs.rebaselines_last_hour = tracker.in_last_hour(now);
        self.status.rebaselines = Some(RebaselineStatus {
            total: tracker.total,
            last_time: tracker.last_time.map(time_string),
        });
    }

    fn conditions(&mut self) {
        let desired = source_conditions(&self.obs);
        self.status.conditions = conditions::merge(
            &self.old.conditions,
            &desired,
            &SOURCE_TYPES,
            self.now,
            self.source.metadata.generation,
        );
        let degraded = conditions::is_true(&self.status.conditions, conditions::DEGRADED);
        self.ctx
            .metrics
            .source_degraded
            .with_label_values(&[self.ns.as_str(), self.source.name_any().as_str()])
            .set(if degraded { 1.0 } else { 0.0 });
    }

    /// Status (only when changed), with Events on its conditions' transitions.
    async fn write_status(&self, applier: &Applier<'_>) -> Result<(), Error> {
        let events = source_events(&self.old.conditions, &self.status.conditions);
        applier
            .report(
                &self.api::<ArchiveSource>(),
                self.source,
                self.source.status.as_ref(),
                &self.status,
                &events,
            )
            .await
    }
}

/// What the engines' `/status` said.
struct EngineScrape {
    engines: Vec<EngineSource>,
    /// Rows of the fullest engine (replicas hold copies, so no sum).
    rows: Option<i64>,
    rebaselines: Vec<RebaselineSample>,
    /// Each engine's baseline load (the last one once loaded).
    progress: Vec<ProgressReport>,
}

/// The engines' API token when their `/status` is protected (`protectReads` with the user's own
/// token, [`crate::source::build::protects_status`]): read from the
/// Secret `spec.access.tokenSecretRef` names, in the source's namespace, at each scrape (a
/// rotated token is used as soon as the pods restart with it). Never logged.
async fn engine_token(ctx: &Context, source: &ArchiveSource) -> Option<String> {
    let access = source.spec.access.as_ref()?;
    if !crate::source::build::protects_status(access) {
        return None;
    }
    let r = access.token_secret_ref.as_ref()?;
    let ns = source.namespace().unwrap_or_default();
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), &ns)
        .get(&r.name)
        .await
        .map_err(|e| {
            tracing::warn!(source = %source.name_any(), secret = %r.name, error = %e, "reading the engines' API token");
        })
        .ok()?;
    let bytes = secret.data.as_ref()?.get(&r.key)?;
    Some(String::from_utf8_lossy(&bytes.0).trim().to_string())
}

/// Asks each engine pod with an IP for its `/status` (this source's entries).
async fn scrape_engines(
    ctx: &Context,
    source: &ArchiveSource,
    tracker_key: &str,
    pods: &[Pod],
) -> EngineScrape {
    let id = source_id(source);
    let mut out = EngineScrape {
        engines: vec![],
        rows: None,
        rebaselines: vec![],
        progress: vec![],
    };
    let last_scrape = ctx
        .trackers
        .locked()
        .get(tracker_key)
        .and_then(|t| t.last_scrape);
    let token = engine_token(ctx, source).await;
    for pod in pods {
        let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
            continue;
        };
        // `/status` only (free of row values); behind the token when reads are protected.
        let Ok(body) = ctx
            .prober
            .get_with_token(&ip, 8080, "/status", token.as_deref())
            .await
        else {
            continue;
        };
        let Some(entries) = observe::parse_engine_status(&body, &id) else {
            continue;
        };
        out.progress
            .extend(observe::parse_engine_progress(&body, &id));
        if let Some(r) = observe::parse_engine_rows(&body, &id) {
            out.rows = Some(out.rows.map_or(r, |m: i64| m.max(r)));
        }
        // The sources' `rebaselines`: the counter behind laredo_source_rebaseline_total.
        let counts: Vec<i64> = entries.iter().filter_map(|e| e.rebaselines).collect();
        if !counts.is_empty() {
            let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
            let new_pod = matches!((last_scrape, created), (Some(l), Some(c)) if c > l);
            out.rebaselines.push(RebaselineSample {
                pod: pod.name_any(),
                total: counts.iter().sum::<i64>() as f64,
                new_pod,
            });
        }
        out.engines.extend(entries);
    }
    out
}
