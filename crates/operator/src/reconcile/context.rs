//! What every reconcile shares: the client, the image of generated pods, metrics, the Event
//! recorder, the pod prober, the re-baseline trackers, a clock, and the caches the controllers'
//! watches fill.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use kube::Client;
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store, store::Writer};

use crate::crd::ArchiveSource;

use crate::builders::BuildContext;
use crate::metrics::Metrics;
use crate::reconcile::probe::Prober;
use crate::source::rebaseline::RebaselineTracker;

pub const MANAGER_EXPORT: &str = "larch-operator/export";
pub const MANAGER_SOURCE: &str = "larch-operator/source";
pub const MANAGER_SOURCE_SET: &str = "larch-operator/source-set";
pub const MANAGER_RESTORE: &str = "larch-operator/restore";

pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// Objects the reconciles read from the controllers' own watches instead of asking the API
/// server: an unchanged fleet costs no request. Only metadata where the hash annotation is all
/// that is compared; managed fields are dropped on the way in.
#[derive(Clone)]
pub struct Caches {
    /// The operator's StatefulSets (their status feeds the ArchiveSource's).
    pub stateful_sets: Store<StatefulSet>,
    pub config_maps: Store<PartialObjectMeta<ConfigMap>>,
    pub services: Store<PartialObjectMeta<Service>>,
    /// Every namespace (labels select them for sets).
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    /// ArchiveSources labelled `larch.dev/source-set` (the sets' children, with status).
    pub set_sources: Store<ArchiveSource>,
    /// Every Secret, metadata only (copies, and per-namespace Secrets a template names).
    pub secrets: Store<PartialObjectMeta<Secret>>,
}

/// The writing ends of [`Caches`], handed once to the watches that fill them.
pub struct CacheWriters {
    pub stateful_sets: Writer<StatefulSet>,
    pub config_maps: Writer<PartialObjectMeta<ConfigMap>>,
    pub services: Writer<PartialObjectMeta<Service>>,
    pub namespaces: Writer<PartialObjectMeta<Namespace>>,
    pub set_sources: Writer<ArchiveSource>,
    pub secrets: Writer<PartialObjectMeta<Secret>>,
}

fn caches() -> (Caches, CacheWriters) {
    let (stateful_sets, sts) = reflector::store();
    let (config_maps, cms) = reflector::store();
    let (services, svcs) = reflector::store();
    let (namespaces, nss) = reflector::store();
    let (set_sources, srcs) = reflector::store();
    let (secrets, secs) = reflector::store();
    (
        Caches {
            stateful_sets,
            config_maps,
            services,
            namespaces,
            set_sources,
            secrets,
        },
        CacheWriters {
            stateful_sets: sts,
            config_maps: cms,
            services: svcs,
            namespaces: nss,
            set_sources: srcs,
            secrets: secs,
        },
    )
}

/// How long a reconcile waits for a cache's first list before it fails (and is retried).
const CACHE_WAIT: Duration = Duration::from_secs(30);

/// Waits until `store` holds its first complete list.
pub async fn cache_ready<K>(store: &Store<K>) -> Result<(), Error>
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    match tokio::time::timeout(CACHE_WAIT, store.wait_until_ready()).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(Error::CacheNotReady),
    }
}

pub struct Context {
    pub client: Client,
    pub build: BuildContext,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    pub prober: Arc<dyn Prober>,
    /// Re-baseline trackers by `namespace/name` of the ArchiveSource.
    pub trackers: Mutex<HashMap<String, RebaselineTracker>>,
    pub clock: Clock,
    pub caches: Caches,
    /// Taken by `reconcile::runner::run` (or a test) to fill `caches`.
    pub cache_writers: Mutex<Option<CacheWriters>>,
    /// Children the API server refused, by `kind/namespace/name`: the hash refused and why.
    /// The same child is not sent again (a failing reconcile writes nothing); a changed one is.
    pub rejected: Mutex<HashMap<String, (String, Rejected)>>,
    /// The ClusterRole the operator binds to itself where it manages Leases
    /// (`--export-lease-role`); `None`: its own role grants them.
    pub lease_rights: Option<LeaseRights>,
}

impl Context {
    pub fn new(
        client: Client,
        image: String,
        metrics: Arc<Metrics>,
        prober: Arc<dyn Prober>,
    ) -> Self {
        let reporter = Reporter {
            controller: "larch-operator".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let (caches, writers) = caches();
        Self {
            caches,
            cache_writers: Mutex::new(Some(writers)),
            recorder: Recorder::new(client.clone(), reporter),
            client,
            build: BuildContext {
                image,
                ..Default::default()
            },
            metrics,
            prober,
            trackers: Mutex::default(),
            rejected: Mutex::default(),
            lease_rights: None,
            clock: Arc::new(Timestamp::now),
        }
    }

    pub fn now(&self) -> Timestamp {
        (self.clock)()
    }
}

pub use super::error::{Error, Rejected};

/// Where the operator's Lease rights come from (`--export-lease-role`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRights {
    /// The ClusterRole the operator may bind (the chart's `<release>-export-leases`).
    pub cluster_role: String,
    /// The operator's ServiceAccount and its namespace.
    pub service_account: String,
    pub namespace: String,
}
