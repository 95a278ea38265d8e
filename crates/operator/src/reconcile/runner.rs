//! The controller runner: one kube-runtime Controller per kind, its watches and triggers, the
//! reconcile metrics and error policy around each reconcile, and the janitor of deleted objects.

use larch_core::locks::MutexExt;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolumeClaim, Pod, Secret, Service,
};
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use super::context::{Context, Error};
use super::status;
use crate::builders::{LABEL_COMPONENT, LABEL_EXPORT, LABEL_MANAGED_BY, MANAGED_BY};
use crate::crd::{ArchiveExport, ArchiveRestore, ArchiveSource, ArchiveSourceSet};
use crate::export::reconcile as export;
use crate::restore::reconcile as restore;
use crate::source::reconcile as source;
use crate::source_set::build::LABEL_SOURCE_SET;
use crate::source_set::reconcile as source_set;

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// A failed reconcile: counted and published as a `ReconcileFailed` Warning Event, both
/// labelled with the step that failed; retried after 30 s.
fn error_policy<K: kube::Resource<DynamicType = ()>>(
    controller: &'static str,
) -> impl Fn(Arc<K>, &Error, Arc<Context>) -> Action {
    move |obj, err, ctx| {
        ctx.metrics
            .errors
            .with_label_values(&[controller, err.label()])
            .inc();
        tracing::warn!(%err, controller, step = err.label(), object = %obj_name(&*obj), "reconcile failed");
        let event = status::event(
            kube::runtime::events::EventType::Warning,
            "ReconcileFailed",
            &err.to_string(),
            err.label(),
        );
        let reference = obj.object_ref(&());
        ctx.metrics
            .api_writes
            .with_label_values(&[controller, "Event", "create"])
            .inc();
        let recorder = ctx.recorder.clone();
        // Best effort, off the controller's loop: the next failure publishes again.
        tokio::spawn(async move {
            if let Err(err) = recorder.publish(&event, &reference).await {
                tracing::warn!(%err, controller, "could not publish the reconcile failure");
            }
        });
        Action::requeue(Duration::from_secs(30))
    }
}

fn obj_name<K: ResourceExt>(obj: &K) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}

/// Wraps a reconcile with the reconcile counter and duration histogram.
async fn measured<K, F, Fut>(
    controller: &'static str,
    obj: Arc<K>,
    ctx: Arc<Context>,
    f: F,
) -> Result<Action, Error>
where
    F: FnOnce(Arc<K>, Arc<Context>) -> Fut,
    Fut: std::future::Future<Output = Result<Action, Error>>,
{
    ctx.metrics
        .reconciles
        .with_label_values(&[controller])
        .inc();
    let start = Instant::now();
    let out = f(obj, ctx.clone()).await;
    ctx.metrics
        .duration
        .with_label_values(&[controller])
        .observe(start.elapsed().as_secs_f64());
    out
}

/// Drops what no reconcile reads and a cache would only hold: managed fields.
fn slim<K: kube::Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// The ArchiveSourceSet controller (cluster-scoped sets, children in any namespace). Triggers:
/// the set, any namespace change (labels decide the selection), its ArchiveSources (by label,
/// status included: that updates the rollup, and re-applies nothing unchanged), and Secrets by
/// metadata only (the shared Secret, its copies, a per-namespace Secret the template names), so
/// no Secret data is cached. Each watch fills a cache the reconcile reads instead of listing.
/// Reconciles of one set are debounced by a second: a burst of child changes (a rollout)
/// collapses into few rollups.
async fn source_sets(ctx: Arc<Context>, caches: SetCacheWriters) {
    let client = ctx.client.clone();
    let sets = Controller::new(
        Api::<ArchiveSourceSet>::all(client.clone()),
        watcher::Config::default().any_semantic(),
    )
    .with_config(controller::Config::default().debounce(Duration::from_secs(1)));
    let all_sets = sets.store();
    let secret_sets = all_sets.clone();
    let namespaces = watcher(
        Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(slim)
    .reflect(caches.namespaces)
    .touched_objects();
    let children = watcher(
        Api::<ArchiveSource>::all(client.clone()),
        watcher::Config::default().labels(LABEL_SOURCE_SET),
    )
    .default_backoff()
    .modify(slim)
    .reflect(caches.set_sources)
    .touched_objects();
    // Restores a set stamped: their status feeds its rollup, a developer's refresh annotation
    // asks it for a new run.
    let restores = watcher(
        Api::<ArchiveRestore>::all(client.clone()),
        watcher::Config::default().labels(LABEL_SOURCE_SET),
    )
    .default_backoff()
    .touched_objects();
    let secrets = watcher(
        Api::<PartialObjectMeta<Secret>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(slim)
    .reflect(caches.secrets)
    .touched_objects();
    sets.watches_stream(namespaces, move |_| {
        all_sets
            .state()
            .iter()
            .map(|s| ObjectRef::from_obj(&**s))
            .collect::<Vec<_>>()
    })
    .watches_stream(children, |s: ArchiveSource| {
        s.labels()
            .get(LABEL_SOURCE_SET)
            .map(|n| ObjectRef::<ArchiveSourceSet>::new(n))
    })
    .watches_stream(restores, |r: ArchiveRestore| {
        r.labels()
            .get(LABEL_SOURCE_SET)
            .map(|n| ObjectRef::<ArchiveSourceSet>::new(n))
    })
    .watches_stream(secrets, move |s| {
        source_set::sets_for_secret(&secret_sets, &s)
    })
    .shutdown_on_signal()
    .run(
        |o, c| measured("source-set", o, c, source_set::reconcile),
        error_policy::<ArchiveSourceSet>("source-set"),
        ctx,
    )
    .for_each(|_| futures::future::ready(()))
    .await
}

/// The cache writers only the set controller fills.
struct SetCacheWriters {
    namespaces: Writer<PartialObjectMeta<Namespace>>,
    set_sources: Writer<ArchiveSource>,
    secrets: Writer<PartialObjectMeta<Secret>>,
}

/// Runs the controllers until a shutdown signal.
/// `source_sets`: run the ArchiveSourceSet controller (it needs every namespace, and Secret
/// rights that a deployment without sets should not grant).
pub async fn run(ctx: Arc<Context>, namespace: Option<String>, source_sets: bool) {
    let ns = namespace.as_deref();
    let (exports, export_store) = export_controller(&ctx, ns);
    let restores = restore_controller(&ctx, ns);
    // The source controller's children fill the caches its reconciles compare against.
    let writers = ctx
        .cache_writers
        .locked()
        .take()
        .expect("controllers::run runs once per Context");
    let set_writers = SetCacheWriters {
        namespaces: writers.namespaces,
        set_sources: writers.set_sources,
        secrets: writers.secrets,
    };
    let source_caches = (writers.stateful_sets, writers.config_maps, writers.services);
    let (sources, source_store) = source_controller(&ctx, ns, source_caches);

    // Sets are cluster-scoped and reach into every namespace: not in single-namespace mode.
    let set_ctx = ctx.clone();
    let sets = async move {
        match namespace {
            None if source_sets => self::source_sets(set_ctx, set_writers).await,
            None => {
                tracing::info!("ArchiveSourceSet controller off (--disable-source-sets)");
                futures::future::pending::<()>().await
            }
            Some(ns) => {
                tracing::info!(namespace = %ns, "ArchiveSourceSet controller off: it needs the operator to watch all namespaces");
                futures::future::pending::<()>().await
            }
        }
    };
    tokio::select! {
        _ = async { futures::join!(exports, sources, restores) } => {}
        _ = sets => {}
        _ = janitor(ctx, export_store, source_store) => {}
    }
}

/// Children the operator manages carry its `managed-by` label.
fn owned_config() -> watcher::Config {
    watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"))
}

/// The ArchiveExport controller, and its store of exports (the janitor reads it).
fn export_controller(
    ctx: &Arc<Context>,
    ns: Option<&str>,
) -> (impl Future<Output = ()> + use<>, Store<ArchiveExport>) {
    let client = ctx.client.clone();
    let cfg = watcher::Config::default().any_semantic();
    let owned = owned_config();
    let export_pods = watcher::Config::default().labels(&format!(
        "{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_COMPONENT}=export"
    ));
    let cleanup_jobs = watcher::Config::default().labels(&format!(
        "{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_COMPONENT}=cleanup"
    ));

    let exports = Controller::new(api::<ArchiveExport>(&client, ns), cfg.clone());
    let export_store = exports.store();
    let exports = exports
        .owns(api::<Job>(&client, ns), owned.clone())
        .owns(api::<CronJob>(&client, ns), owned.clone())
        .owns(api::<Deployment>(&client, ns), owned.clone())
        .owns(api::<PersistentVolumeClaim>(&client, ns), owned.clone())
        // Export pods carry the export's name: their termination messages feed status.
        .watches(api::<Pod>(&client, ns), export_pods, |pod: Pod| {
            let name = pod.labels().get(LABEL_EXPORT).cloned();
            let ns = pod.namespace();
            name.zip(ns).map(|(n, ns)| ObjectRef::new(&n).within(&ns))
        })
        // A deletion's cleanup Job has no owner (see export::cleanup_job): found by label.
        .watches(api::<Job>(&client, ns), cleanup_jobs, |job: Job| {
            let name = job.labels().get(LABEL_EXPORT).cloned();
            let ns = job.namespace();
            name.zip(ns).map(|(n, ns)| ObjectRef::new(&n).within(&ns))
        })
        .shutdown_on_signal()
        .run(
            |o, c| measured("export", o, c, export::reconcile),
            error_policy::<ArchiveExport>("export"),
            ctx.clone(),
        )
        .for_each(|_| futures::future::ready(()));
    (exports, export_store)
}

/// The ArchiveRestore controller.
fn restore_controller(ctx: &Arc<Context>, ns: Option<&str>) -> impl Future<Output = ()> + use<> {
    let client = ctx.client.clone();
    let cfg = watcher::Config::default().any_semantic();
    // Restores own their Jobs; their pods' termination messages are read once a Job ends.
    Controller::new(api::<ArchiveRestore>(&client, ns), cfg)
        .owns(api::<Job>(&client, ns), owned_config())
        .shutdown_on_signal()
        .run(
            |o, c| measured("restore", o, c, restore::reconcile),
            error_policy::<ArchiveRestore>("restore"),
            ctx.clone(),
        )
        .for_each(|_| futures::future::ready(()))
}

/// The ArchiveSource controller, its children's watches filling `caches` (StatefulSets,
/// ConfigMaps, Services), and its store of sources (the janitor reads it).
fn source_controller(
    ctx: &Arc<Context>,
    ns: Option<&str>,
    caches: (
        Writer<StatefulSet>,
        Writer<PartialObjectMeta<ConfigMap>>,
        Writer<PartialObjectMeta<Service>>,
    ),
) -> (impl Future<Output = ()> + use<>, Store<ArchiveSource>) {
    let client = ctx.client.clone();
    let cfg = watcher::Config::default().any_semantic();
    let owned = owned_config();
    let (sts_writer, config_map_writer, service_writer) = caches;
    let stateful_sets = watcher(api::<StatefulSet>(&client, ns), owned.clone())
        .default_backoff()
        .modify(slim)
        .reflect(sts_writer)
        .touched_objects();
    let config_maps = watcher(
        api::<PartialObjectMeta<ConfigMap>>(&client, ns),
        owned.clone(),
    )
    .default_backoff()
    .modify(slim)
    .reflect(config_map_writer)
    .touched_objects();
    let services = watcher(api::<PartialObjectMeta<Service>>(&client, ns), owned)
        .default_backoff()
        .modify(slim)
        .reflect(service_writer)
        .touched_objects();

    let sources = Controller::new(api::<ArchiveSource>(&client, ns), cfg.clone());
    let store = sources.store();
    let source_store = store.clone();
    let sources = sources
        .owns_stream(stateful_sets)
        .owns_stream(config_maps)
        .owns_stream(services)
        // An ArchiveExport change (location, status key prefix) re-resolves the sources using it.
        .watches(
            api::<ArchiveExport>(&client, ns),
            cfg,
            move |e: ArchiveExport| {
                let (name, ns) = (e.name_any(), e.namespace());
                store
                    .state()
                    .iter()
                    .filter(|s| {
                        s.namespace() == ns
                            && s.spec
                                .archive
                                .export_ref
                                .as_ref()
                                .is_some_and(|r| r.name == name)
                    })
                    .map(|s| ObjectRef::from_obj(&**s))
                    .collect::<Vec<_>>()
            },
        )
        .shutdown_on_signal()
        .run(
            |o, c| measured("source", o, c, source::reconcile),
            error_policy::<ArchiveSource>("source"),
            ctx.clone(),
        )
        .for_each(|_| futures::future::ready(()));
    (sources, source_store)
}

/// Drops per-object gauges and re-baseline trackers of deleted objects (reconcile does not see
/// the end of a deletion), so no stale-archive alert fires for an ArchiveExport that is gone.
async fn janitor(ctx: Arc<Context>, exports: Store<ArchiveExport>, sources: Store<ArchiveSource>) {
    if exports.wait_until_ready().await.is_err() || sources.wait_until_ready().await.is_err() {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    loop {
        tick.tick().await;
        let key = |ns: Option<String>, name: String| (ns.unwrap_or_default(), name);
        let live_sources: HashSet<(String, String)> = sources
            .state()
            .iter()
            .map(|s| key(s.namespace(), s.name_any()))
            .collect();
        let mut live = live_sources.clone();
        live.extend(
            exports
                .state()
                .iter()
                .map(|e| key(e.namespace(), e.name_any())),
        );
        for (ns, name) in ctx.metrics.tracked() {
            if !live.contains(&(ns.clone(), name.clone())) {
                ctx.metrics.forget(&ns, &name);
            }
        }
        ctx.trackers.locked().retain(|k, _| {
            k.split_once('/')
                .is_some_and(|(ns, n)| live_sources.contains(&(ns.to_string(), n.to_string())))
        });
    }
}
