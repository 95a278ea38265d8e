//! The ArchiveSource controller, as steps that take and return values: dereference
//! (`exportRef`, the Secrets, keys and CA bundles the engines mount) → validate → build → apply (server-side apply, one field manager; a
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
use kube::runtime::events::Event;

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
use crate::reconcile::step::Blocked;
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
    let round = Round::new(&source, &ctx, &applier, ns);
    let old = source.status.clone().unwrap_or_default();
    // Nothing is built while something is missing or the spec cannot work. The ArchiveExport
    // watch brings an export that appears; Secrets and ConfigMaps are looked at again after
    // RECHECK.
    let resolved = round.dereference().await?;
    let seen = match resolved.and_then(|export| round.validate(export.as_ref())) {
        Err(blocked) => Err(blocked),
        Ok(archive) => {
            let children = build::children(&source, &archive, &ctx.build);
            match round.apply(children).await {
                Err(Error::Rejected(r)) => Err(Blocked::rejected(&r)),
                sts => Ok(round.observe(&old, &sts?).await?),
            }
        }
    };
    let (status, obs, requeue) = status(&source, &old, seen, round.now);
    round.record_metrics(&status, &obs);
    let events = source_events(&old.conditions, &status.conditions);
    round.write_status(&status, &events).await?;
    Ok(Action::requeue(requeue))
}

/// What one reconcile of a source works with; its steps change none of it.
struct Round<'a> {
    source: &'a ArchiveSource,
    ctx: &'a Context,
    applier: &'a Applier<'a>,
    ns: String,
    now: Timestamp,
}

/// What the StatefulSet and the engines showed this round.
struct Seen {
    ready_replicas: i32,
    rolled_out: bool,
    pods_not_created: Option<String>,
    pod_failure: Option<Problem>,
    scrape: EngineScrape,
    /// The re-baseline tracker, fed with this round's samples.
    tracker: RebaselineTracker,
}

impl<'a> Round<'a> {
    fn new(
        source: &'a ArchiveSource,
        ctx: &'a Context,
        applier: &'a Applier<'a>,
        ns: String,
    ) -> Self {
        Self {
            source,
            ctx,
            applier,
            ns,
            now: ctx.now(),
        }
    }

    fn api<K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>>(&self) -> Api<K>
    where
        K::DynamicType: Default,
    {
        Api::namespaced(self.ctx.client.clone(), &self.ns)
    }

    /// The export (`exportRef`), then what the engines mount; returns the export.
    async fn dereference(&self) -> Result<Result<Option<ArchiveExport>, Blocked>, Error> {
        let export = match &self.source.spec.archive.export_ref {
            Some(r) => self
                .api::<ArchiveExport>()
                .get_opt(&r.name)
                .await
                .map_err(Error::Dereference)?,
            None => None,
        };
        if let (Some(r), None) = (&self.source.spec.archive.export_ref, &export) {
            // Its watch brings the export once it appears: no recheck.
            let missing = Missing::Export {
                name: r.name.clone(),
            };
            return Ok(Err(Blocked {
                recheck: None,
                ..Blocked::missing(&missing, &self.ns)
            }));
        }
        let references = source_references(self.source, export.as_ref());
        let missing = dereference::check(&self.ctx.client, &self.ns, &references)
            .await
            .map_err(Error::Dereference)?;
        Ok(match missing {
            Some(missing) => Err(Blocked::missing(&missing, &self.ns)),
            None => Ok(export),
        })
    }

    /// What the schema cannot check, then the archive the engines read.
    fn validate(&self, export: Option<&ArchiveExport>) -> Result<ResolvedArchive, Blocked> {
        validate::source(self.source)
            .and_then(|()| self.token_available())
            .and_then(|()| resolve(self.source, export))
            .map_err(Blocked::invalid)
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

    /// Applies the engines' ConfigMap, Service and StatefulSet (compared against the caches);
    /// returns the StatefulSet as it now is.
    async fn apply(&self, children: build::SourceChildren) -> Result<StatefulSet, Error> {
        let caches = &self.ctx.caches;
        cache_ready(&caches.config_maps).await?;
        cache_ready(&caches.services).await?;
        cache_ready(&caches.stateful_sets).await?;
        self.ensure_token_secret().await?;
        let mut set = ChildSet::new(
            self.applier,
            format!("{LABEL_SOURCE}={}", self.source.name_any()),
        );
        set.apply_cached(children.config_map, &caches.config_maps)
            .await?;
        set.apply_cached(children.service, &caches.services).await?;
        // Optional children: applied when wanted, deleted when not.
        let name = self.source.name_any();
        self.applier
            .apply_or_prune(&self.api::<NetworkPolicy>(), &name, children.network_policy)
            .await?;
        self.applier
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

    /// The StatefulSet (replicas ready and rolled out; too few pods: why the StatefulSet
    /// controller could not create one), then the engines' pods and `/status`: failures,
    /// positions, lag, re-baselines.
    async fn observe(&self, old: &ArchiveSourceStatus, sts: &StatefulSet) -> Result<Seen, Error> {
        let (suspended, desired) = (suspended(self.source), desired_replicas(self.source));
        let st = sts.status.clone().unwrap_or_default();
        let rolled_out = st.observed_generation.unwrap_or(0)
            >= sts.metadata.generation.unwrap_or(0)
            && st.updated_replicas.unwrap_or(0) >= desired
            && st.replicas <= desired;
        let pods_not_created = if !suspended && sts.status.is_some() && st.replicas < desired {
            failed_create(&self.ctx.client, &self.ns, sts).await?
        } else {
            None
        };
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
        let pod_failure = pod_failure::first_failure(&pods, build::CONTAINER, self.now)
            .filter(|_| !suspended)
            .map(|f| Problem::of_pod("engine", &f));
        let scrape = scrape_engines(self.ctx, self.source, &self.tracker_key(), &pods).await;
        let tracker = self.track_rebaselines(old, &scrape.rebaselines);
        Ok(Seen {
            ready_replicas: st.ready_replicas.unwrap_or(0),
            rolled_out,
            pods_not_created,
            pod_failure,
            scrape,
            tracker,
        })
    }

    /// The re-baseline tracker's key: `namespace/name`.
    fn tracker_key(&self) -> String {
        format!("{}/{}", self.ns, self.source.name_any())
    }

    /// Feeds the engines' re-baseline counters to the tracker (resumed from status after a
    /// restart); returns it as it now is.
    fn track_rebaselines(
        &self,
        old: &ArchiveSourceStatus,
        samples: &[RebaselineSample],
    ) -> RebaselineTracker {
        let mut trackers = self.ctx.trackers.locked();
        let t = trackers.entry(self.tracker_key()).or_insert_with(|| {
            let r = old.rebaselines.clone().unwrap_or_default();
            RebaselineTracker::resume(r.total, r.last_time.and_then(|t| t.parse().ok()))
        });
        t.observe(self.now, samples);
        t.clone()
    }

    /// The lag and re-baseline gauges (from what the engines said) and the degraded one.
    fn record_metrics(&self, status: &ArchiveSourceStatus, obs: &SourceObservation) {
        let name = self.source.name_any();
        let labels = [self.ns.as_str(), name.as_str()];
        let metrics = &self.ctx.metrics;
        if obs.blocked.is_none() {
            // The lag behind the head, not the head's age (which grows on an idle archive).
            metrics
                .source_lag
                .with_label_values(&labels)
                .set(status.lag.as_ref().map_or(0.0, |l| l.seconds as f64));
            metrics
                .source_rebaselines_last_hour
                .with_label_values(&labels)
                .set(obs.rebaselines_last_hour as f64);
        }
        let degraded = conditions::is_true(&status.conditions, conditions::DEGRADED);
        metrics
            .source_degraded
            .with_label_values(&labels)
            .set(if degraded { 1.0 } else { 0.0 });
    }

    /// Status (only when changed), with Events on its conditions' transitions.
    async fn write_status(
        &self,
        status: &ArchiveSourceStatus,
        events: &[Event],
    ) -> Result<(), Error> {
        self.applier
            .report(
                &self.api::<ArchiveSource>(),
                self.source,
                self.source.status.as_ref(),
                status,
                events,
            )
            .await
    }
}

fn suspended(source: &ArchiveSource) -> bool {
    source.spec.suspend == Some(true)
}

fn desired_replicas(source: &ArchiveSource) -> i32 {
    if suspended(source) {
        0
    } else {
        source.spec.replicas.unwrap_or(1)
    }
}

/// The status of what the round saw (the engines' positions, lag, progress, re-baselines;
/// the conditions), the observation it rests on, and the requeue (engines are polled for lag
/// and re-baselines; faster while a load runs).
fn status(
    source: &ArchiveSource,
    old: &ArchiveSourceStatus,
    seen: Result<Seen, Blocked>,
    now: Timestamp,
) -> (ArchiveSourceStatus, SourceObservation, Duration) {
    let base = ArchiveSourceStatus {
        observed_generation: source.metadata.generation,
        ..old.clone()
    };
    let obs = SourceObservation {
        blocked: None,
        pod_failure: None,
        suspended: suspended(source),
        desired_replicas: desired_replicas(source),
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
    let (status, obs, requeue) = match seen {
        Err(blocked) => {
            let requeue = blocked.recheck.unwrap_or(IDLE);
            let obs = SourceObservation {
                blocked: Some(blocked.problem),
                ..obs
            };
            (base, obs, requeue)
        }
        Ok(seen) => seen_status(base, obs, seen, now),
    };
    let conditions = conditions::merge(
        &old.conditions,
        &source_conditions(&obs),
        &SOURCE_TYPES,
        now,
        source.metadata.generation,
    );
    (
        ArchiveSourceStatus {
            conditions,
            ..status
        },
        obs,
        requeue,
    )
}

/// Engines are polled for lag and re-baselines.
const IDLE: Duration = Duration::from_secs(30);

/// What the StatefulSet and the engines said, into status and the observation. `status.lag`
/// comes from the engines' `behind` (the furthest), `status.progress` from their baseline
/// loads (the engine furthest behind; while none answers, what was last seen), which brings
/// the source back every [`progress::REQUEUE_WHILE_RUNNING`] while a load runs.
fn seen_status(
    base: ArchiveSourceStatus,
    obs: SourceObservation,
    seen: Seen,
    now: Timestamp,
) -> (ArchiveSourceStatus, SourceObservation, Duration) {
    let engines = &seen.scrape.engines;
    let behind: Vec<_> = engines.iter().filter_map(|e| e.behind).collect();
    let new = if seen.scrape.progress.is_empty() {
        base.progress.clone()
    } else {
        progress::source_progress(&seen.scrape.progress)
    };
    let requeue = if progress::is_running(new.as_ref()) {
        IDLE.min(progress::REQUEUE_WHILE_RUNNING)
    } else {
        IDLE
    };
    let status = ArchiveSourceStatus {
        ready_replicas: Some(seen.ready_replicas),
        position: engines
            .iter()
            .filter_map(|e| e.position.clone())
            .min_by_key(|p| Lsn::parse(p).unwrap_or_default()),
        head: engines
            .iter()
            .filter_map(|e| e.head.clone())
            .max_by_key(|p| Lsn::parse(p).unwrap_or_default()),
        // The time of the head, not its age: status changes when the head does, never by
        // itself (kubectl shows the age in the DATA AGE column).
        head_time: engines.iter().filter_map(|e| e.head_time.clone()).max(),
        // Pinned at a point: every engine resolves it alike; the first that has says where.
        restored: engines
            .iter()
            .filter_map(|e| e.at.clone())
            .find(|a| a.position.is_some()),
        rows: (seen.scrape.rows).or_else(|| engines.iter().filter_map(|e| e.rows).max()),
        lag: progress::source_lag(&behind),
        progress: progress::stamp(base.progress.as_ref(), new, now),
        rebaselines: Some(RebaselineStatus {
            total: seen.tracker.total,
            last_time: seen.tracker.last_time.map(time_string),
        }),
        ..base
    };
    let obs = SourceObservation {
        ready_replicas: seen.ready_replicas,
        rolled_out: seen.rolled_out,
        pods_not_created: seen.pods_not_created,
        pod_failure: seen.pod_failure,
        rebaselining: seen.tracker.recent(now),
        rebaselines_last_hour: seen.tracker.in_last_hour(now),
        engines: seen.scrape.engines,
        ..obs
    };
    (status, obs, requeue)
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
