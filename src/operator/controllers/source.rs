//! The ArchiveSource controller: dereference (`exportRef`, the Secrets, keys and CA bundles
//! the engines mount) → validate → build → apply (server-side apply, one field manager; a
//! refused child is a condition) → observe (StatefulSet, engine pods' failures, engines'
//! `/status` and `/metrics`) → status, with Events on failure and re-baseline transitions.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Pod, Service};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};

use super::apply::Applier;
use super::context::{Context, Error, MANAGER_SOURCE, cache_ready};
use crate::archive::position::Lsn;
use crate::operator::builders::engine_config::{resolve, source_id};
use crate::operator::builders::{LABEL_SOURCE, source as build};
use crate::operator::conditions::{
    self, DEFAULT_MAX_REBASELINES_PER_HOUR, Problem, SOURCE_TYPES, SourceObservation,
    source_conditions, time_string,
};
use crate::operator::crd::archive_export::ArchiveExport;
use crate::operator::crd::archive_source::{ArchiveSource, ArchiveSourceStatus, RebaselineStatus};
use crate::operator::crd::common::Condition;
use crate::operator::dereference::{self, Missing};
use crate::operator::observe::{self, EngineSource};
use crate::operator::rebaseline::RebaselineTracker;
use crate::operator::{pod_failure, validate};

/// Events for failure, re-baseline and readiness transitions (first visits only when
/// abnormal).
fn transition_events(before: &[Condition], after: &[Condition]) -> Vec<Event> {
    let mut out = vec![];
    let changed = conditions::transitions(before, after);
    // A failure's own Event says why it is not ready.
    let failing = changed.iter().any(|c| {
        c.status == "True" && (c.type_ == conditions::STALLED || c.type_ == conditions::DEGRADED)
    });
    let was = |t: &str| before.iter().find(|b| b.type_ == t);
    for c in changed {
        let first = was(&c.type_).is_none();
        let (type_, reason) = match (c.type_.as_str(), c.status.as_str()) {
            (conditions::REBASELINING, "True") => (EventType::Warning, "Rebaselining"),
            (conditions::REBASELINING, "False") if !first => {
                (EventType::Normal, "RebaselineSettled")
            }
            // The condition's reason: a failing engine's, FrequentRebaselines or ShortChain.
            (conditions::STALLED, "True") => (EventType::Warning, c.reason.as_str()),
            (conditions::DEGRADED, "True") if !conditions::is_true(after, conditions::STALLED) => {
                (EventType::Warning, c.reason.as_str())
            }
            (conditions::DEGRADED, "False") if !first => {
                let rebaselines = was(conditions::DEGRADED)
                    .is_some_and(|d| d.reason == "FrequentRebaselines" || d.reason == "ShortChain");
                let reason = if rebaselines {
                    "RebaselinesNormal"
                } else {
                    "Recovered"
                };
                (EventType::Normal, reason)
            }
            (conditions::READY, "True") => (EventType::Normal, "Ready"),
            (conditions::READY, "False") if !first && !failing => (EventType::Warning, "NotReady"),
            _ => continue,
        };
        out.push(Event {
            type_,
            reason: reason.into(),
            note: Some(c.message.chars().take(1000).collect()),
            action: "Observe".into(),
            secondary: None,
        });
    }
    out
}

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
        .await?;
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
    let name = source.name_any();
    let key = format!("{ns}/{name}");
    let now = ctx.now();
    let client = ctx.client.clone();
    let old = source.status.clone().unwrap_or_default();
    let applier = Applier::new(&ctx, "source", MANAGER_SOURCE);
    let mut status = ArchiveSourceStatus {
        observed_generation: source.metadata.generation,
        ..old.clone()
    };
    let suspended = source.spec.suspend == Some(true);
    let desired_replicas = if suspended {
        0
    } else {
        source.spec.replicas.unwrap_or(1)
    };
    let max_per_hour = source
        .spec
        .rebaseline
        .as_ref()
        .and_then(|r| r.max_per_hour)
        .map(|m| m as u64)
        .unwrap_or(DEFAULT_MAX_REBASELINES_PER_HOUR);
    let mut obs = SourceObservation {
        blocked: None,
        pod_failure: None,
        suspended,
        desired_replicas,
        ready_replicas: 0,
        rolled_out: false,
        pods_not_created: None,
        engines: vec![],
        rebaselining: false,
        rebaselines_last_hour: 0,
        max_per_hour,
    };

    // Engines are polled for lag and re-baselines.
    let mut requeue = Duration::from_secs(30);

    // Dereference (the export, then what the engines mount), then validate: nothing is built
    // while something is missing or the spec cannot work. The ArchiveExport watch brings an
    // export that appears; Secrets and ConfigMaps are looked at again after RECHECK.
    let export = match &source.spec.archive.export_ref {
        Some(r) => {
            Api::<ArchiveExport>::namespaced(client.clone(), &ns)
                .get_opt(&r.name)
                .await?
        }
        None => None,
    };
    let references = dereference::source_references(&source, export.as_ref());
    if let (Some(r), None) = (&source.spec.archive.export_ref, &export) {
        let missing = Missing::Export {
            name: r.name.clone(),
        };
        obs.blocked = Some(Problem::new(missing.reason(), missing.message(&ns)));
    } else if let Some(missing) = dereference::check(&client, &ns, &references).await? {
        obs.blocked = Some(Problem::new(missing.reason(), missing.message(&ns)));
        requeue = dereference::RECHECK;
    } else if let Err(message) = validate::source(&source) {
        obs.blocked = Some(Problem::new("InvalidSpec", message));
    }
    let resolved = match obs.blocked {
        Some(_) => None,
        None => match resolve(&source, export.as_ref()) {
            Ok(r) => Some(r),
            Err(message) => {
                obs.blocked = Some(Problem::new("InvalidSpec", message));
                None
            }
        },
    };

    let mut applied = None;
    if let Some(archive) = &resolved {
        let caches = &ctx.caches;
        cache_ready(&caches.config_maps).await?;
        cache_ready(&caches.services).await?;
        cache_ready(&caches.stateful_sets).await?;
        let children = build::children(&source, archive, &ctx.build);
        let result: Result<StatefulSet, Error> = async {
            applier
                .apply_cached(
                    &Api::<ConfigMap>::namespaced(client.clone(), &ns),
                    children.config_map,
                    &caches.config_maps,
                )
                .await?;
            applier
                .apply_cached(
                    &Api::<Service>::namespaced(client.clone(), &ns),
                    children.service,
                    &caches.services,
                )
                .await?;
            Ok(
                match applier
                    .apply_cached(
                        &Api::<StatefulSet>::namespaced(client.clone(), &ns),
                        children.stateful_set,
                        &caches.stateful_sets,
                    )
                    .await?
                {
                    (Some(s), _) => s,
                    (None, Some(s)) => (*s).clone(),
                    (None, None) => {
                        unreachable!("an apply is skipped only for an observed object")
                    }
                },
            )
        }
        .await;
        match result {
            Ok(sts) => applied = Some(sts),
            Err(Error::Rejected(r)) => {
                obs.blocked = Some(Problem::new("ChildRejected", r.to_string()));
                requeue = Duration::from_secs(60);
            }
            Err(e) => return Err(e),
        }
    }

    if let Some(sts) = applied {
        let st = sts.status.clone().unwrap_or_default();
        obs.ready_replicas = st.ready_replicas.unwrap_or(0);
        obs.rolled_out = st.observed_generation.unwrap_or(0)
            >= sts.metadata.generation.unwrap_or(0)
            && st.updated_replicas.unwrap_or(0) >= desired_replicas
            && st.replicas <= desired_replicas;
        status.ready_replicas = Some(obs.ready_replicas);
        // Too few pods: say why when the StatefulSet controller could not create one.
        if !suspended && sts.status.is_some() && st.replicas < desired_replicas {
            obs.pods_not_created = failed_create(&client, &ns, &sts).await?;
        }

        // Scrape the engines.
        let id = source_id(&source);
        let pods = Api::<Pod>::namespaced(client.clone(), &ns)
            .list(&ListParams::default().labels(&format!("{LABEL_SOURCE}={name}")))
            .await?;
        if !suspended {
            obs.pod_failure = pod_failure::first_failure(&pods.items, build::CONTAINER, now)
                .map(|f| Problem::of_pod("engine", &f));
        }
        let mut samples = vec![];
        let mut engines: Vec<EngineSource> = vec![];
        // Rows of the fullest engine (replicas hold copies, so no sum).
        let mut rows: Option<i64> = None;
        let last_scrape = ctx
            .trackers
            .lock()
            .unwrap()
            .get(&key)
            .and_then(|t| t.last_scrape);
        for pod in &pods.items {
            let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
                continue;
            };
            if let Ok(body) = ctx.prober.get(&ip, 8080, "/status").await
                && let Some(entries) = observe::parse_engine_status(&body, &id)
            {
                engines.extend(entries);
                if let Some(r) = observe::parse_engine_rows(&body, &id) {
                    rows = Some(rows.map_or(r, |m: i64| m.max(r)));
                }
            }
            if let Ok(text) = ctx.prober.get(&ip, 8080, "/metrics").await
                && let Some(v) = observe::parse_rebaseline_total(&text, &id)
            {
                let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
                let is_new = matches!((last_scrape, created), (Some(l), Some(c)) if c > l);
                samples.push((pod.name_any(), v, is_new));
            }
        }
        let tracker = {
            let mut trackers = ctx.trackers.lock().unwrap();
            let t = trackers.entry(key.clone()).or_insert_with(|| {
                let r = old.rebaselines.clone().unwrap_or_default();
                RebaselineTracker::resume(r.total, r.last_time.and_then(|t| t.parse().ok()))
            });
            t.observe(now, &samples);
            t.clone()
        };
        obs.rebaselining = tracker.recent(now);
        obs.rebaselines_last_hour = tracker.in_last_hour(now);
        status.rebaselines = Some(RebaselineStatus {
            total: tracker.total,
            last_time: tracker.last_time.map(time_string),
        });
        status.position = engines
            .iter()
            .filter_map(|e| e.position.clone())
            .min_by_key(|p| Lsn::parse(p).unwrap_or_default());
        status.head = engines
            .iter()
            .filter_map(|e| e.head.clone())
            .max_by_key(|p| Lsn::parse(p).unwrap_or_default());
        // The time of the head, not its age: status changes when the head does, never by
        // itself (kubectl shows the age in the HEAD AGE column).
        status.head_time = engines.iter().filter_map(|e| e.head_time.clone()).max();
        let lag = engines
            .iter()
            .filter_map(|e| e.lag_seconds)
            .fold(None, |m: Option<f64>, l| Some(m.map_or(l, |m| m.max(l))));
        status.rows = rows.or_else(|| engines.iter().filter_map(|e| e.rows).max());
        obs.engines = engines;
        ctx.metrics
            .source_lag
            .with_label_values(&[ns.as_str(), name.as_str()])
            .set(lag.unwrap_or(0.0));
        ctx.metrics
            .source_rebaselines_last_hour
            .with_label_values(&[ns.as_str(), name.as_str()])
            .set(obs.rebaselines_last_hour as f64);
    }

    let desired = source_conditions(&obs);
    status.conditions = conditions::merge(
        &old.conditions,
        &desired,
        &SOURCE_TYPES,
        now,
        source.metadata.generation,
    );
    ctx.metrics
        .source_degraded
        .with_label_values(&[ns.as_str(), name.as_str()])
        .set(
            if conditions::is_true(&status.conditions, conditions::DEGRADED) {
                1.0
            } else {
                0.0
            },
        );
    let events = transition_events(&old.conditions, &status.conditions);
    applier
        .report(
            &Api::<ArchiveSource>::namespaced(client.clone(), &ns),
            &*source,
            source.status.as_ref(),
            &status,
            &events,
        )
        .await?;
    Ok(Action::requeue(requeue))
}
