//! ArchiveSource conditions from what its reconcile observed (pure).

use crate::reconcile::conditions::*;
use crate::source::observe::EngineSource;

pub const SOURCE_TYPES: [&str; 6] = [
    READY,
    RECONCILING,
    STALLED,
    CAUGHT_UP,
    REBASELINING,
    DEGRADED,
];

/// Lag below which an engine counts as caught up.
pub const CAUGHT_UP_LAG_SECONDS: f64 = 60.0;
/// Default of `spec.rebaseline.maxPerHour`.
pub const DEFAULT_MAX_REBASELINES_PER_HOUR: u64 = 3;

#[derive(Clone, Debug, PartialEq)]
pub struct SourceObservation {
    /// Nothing could be built: the referenced ArchiveExport or a Secret is missing, the spec
    /// cannot work, the API server refused a child.
    pub blocked: Option<Problem>,
    /// The first failing engine pod (crash-looping, cannot start).
    pub pod_failure: Option<Problem>,
    pub suspended: bool,
    pub desired_replicas: i32,
    pub ready_replicas: i32,
    /// The StatefulSet controller has seen the latest template and every replica runs it.
    pub rolled_out: bool,
    /// The StatefulSet has fewer pods than wanted and the last attempt to create one failed
    /// (its `FailedCreate` event: a quota, a LimitRange, a missing ServiceAccount...).
    pub pods_not_created: Option<String>,
    /// The engines' `/status` entries for this source (pods that answered).
    pub engines: Vec<EngineSource>,
    pub rebaselining: bool,
    pub rebaselines_last_hour: u64,
    pub max_per_hour: u64,
}

pub fn source_conditions(o: &SourceObservation) -> Vec<Cond> {
    if let Some(p) = &o.blocked {
        return blocked(p);
    }
    let pod_failure = o.pod_failure.as_ref().filter(|_| !o.suspended);
    let mut out = readiness(o, pod_failure);
    out.push(caught_up(&o.engines));
    out.push(rebaselining(o));
    out.push(degraded(o, pod_failure));
    out
}

/// `Ready`, `Reconciling` and `Stalled`: suspended, pods that cannot be created, a failing
/// engine, every engine ready, or waiting for them.
fn readiness(o: &SourceObservation, pod_failure: Option<&Problem>) -> Vec<Cond> {
    use Status::*;
    let mut out = vec![];
    if o.suspended {
        out.extend([
            c(READY, True, "Suspended", "scaled to zero"),
            c(RECONCILING, False, "Suspended", ""),
            c(STALLED, False, "Suspended", ""),
        ]);
    } else if let Some(err) = o
        .pods_not_created
        .as_ref()
        .filter(|_| o.ready_replicas < o.desired_replicas)
    {
        let msg = format!(
            "{}/{} engines ready; the StatefulSet cannot create engine pods: {err}",
            o.ready_replicas, o.desired_replicas
        );
        out.extend([
            c(READY, False, "PodCreationFailed", msg.clone()),
            c(RECONCILING, False, "PodCreationFailed", ""),
            c(STALLED, True, "PodCreationFailed", msg),
        ]);
    } else if let Some(p) = pod_failure {
        out.extend(failing(p).into_iter().take(3));
    } else if o.ready_replicas >= o.desired_replicas && o.rolled_out {
        let msg = format!("{}/{} engines ready", o.ready_replicas, o.desired_replicas);
        out.extend([
            c(READY, True, "EnginesReady", msg),
            c(RECONCILING, False, "EnginesReady", ""),
            c(STALLED, False, "EnginesReady", ""),
        ]);
    } else {
        let msg = format!(
            "{}/{} engines ready (an engine is ready once every table has its first baseline)",
            o.ready_replicas, o.desired_replicas
        );
        out.extend([
            c(READY, False, "WaitingForEngines", msg.clone()),
            c(RECONCILING, True, "WaitingForEngines", msg),
            c(STALLED, False, "WaitingForEngines", ""),
        ]);
    }
    out
}

fn rebaselining(o: &SourceObservation) -> Cond {
    use Status::*;
    if o.rebaselining {
        c(
            REBASELINING,
            True,
            "RebaselineObserved",
            "an engine re-baselined recently",
        )
    } else {
        c(REBASELINING, False, "Stable", "no recent re-baseline")
    }
}

/// `Degraded`: a failing engine, engines short of the head, or frequent re-baselines.
fn degraded(o: &SourceObservation, pod_failure: Option<&Problem>) -> Cond {
    use Status::*;
    let short: Vec<String> = o
        .engines
        .iter()
        .filter_map(|e| e.short_chain.as_ref())
        .map(|s| {
            format!(
                "the diff chain stops at {} before the head {} ({})",
                s.reached, s.head, s.reason
            )
        })
        .collect();
    if let Some(p) = pod_failure {
        // Worse than anything the running engines report: an engine does not run.
        c(DEGRADED, True, &p.reason, p.message.clone())
    } else if let Some(first) = short.first() {
        // Worse than frequent re-baselines: the engines serve an older state than the head.
        c(
            DEGRADED,
            True,
            "ShortChain",
            format!(
                "{}/{} engines serve an older state than the archive's head: {first}; the writer must repair the chain or write a new epoch (see `larch archive verify`)",
                short.len(),
                o.engines.len()
            ),
        )
    } else if o.rebaselines_last_hour > o.max_per_hour {
        c(
            DEGRADED,
            True,
            "FrequentRebaselines",
            format!(
                "{} re-baselines in the last hour (more than {} per hour): the archive's diffs may be broken or too far behind",
                o.rebaselines_last_hour, o.max_per_hour
            ),
        )
    } else {
        c(
            DEGRADED,
            False,
            "AsExpected",
            format!("{} re-baselines in the last hour", o.rebaselines_last_hour),
        )
    }
}

fn caught_up(engines: &[EngineSource]) -> Cond {
    use Status::*;
    if engines.is_empty() {
        return c(
            CAUGHT_UP,
            Unknown,
            "NoData",
            "no engine reported its status",
        );
    }
    if let Some(s) = engines.iter().find_map(|e| e.short_chain.as_ref()) {
        return c(
            CAUGHT_UP,
            False,
            "ShortChain",
            format!(
                "an engine is stuck at {}: the diff chain does not reach the head {}",
                s.reached, s.head
            ),
        );
    }
    let lagging: Vec<String> = engines
        .iter()
        .filter(|e| {
            let at_head = matches!((&e.position, &e.head), (Some(p), Some(h)) if p == h);
            // How long the oldest diff not applied has waited; from engines without
            // `behind`, the head's age.
            let waited = e.behind.map(|b| b.seconds).or(e.lag_seconds);
            let small_lag = waited.is_some_and(|l| l <= CAUGHT_UP_LAG_SECONDS);
            !(at_head || small_lag)
        })
        // Positions, not the age of the head: the message must not change by itself.
        .map(|e| match (&e.position, &e.head) {
            (Some(p), Some(h)) => format!("at {p}, head {h}"),
            _ => "position behind head".into(),
        })
        .collect();
    if lagging.is_empty() {
        c(
            CAUGHT_UP,
            True,
            "CaughtUp",
            "every engine is at the archive's head",
        )
    } else {
        c(
            CAUGHT_UP,
            False,
            "Lagging",
            format!(
                "{}/{} engines behind: {}",
                lagging.len(),
                engines.len(),
                lagging.join(", ")
            ),
        )
    }
}
