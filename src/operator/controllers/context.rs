//! What every reconcile shares: the client, the image of generated pods, metrics, the Event
//! recorder, the pod prober, the re-baseline trackers and a clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};

use crate::operator::builders::BuildContext;
use crate::operator::metrics::Metrics;
use crate::operator::probe::Prober;
use crate::operator::rebaseline::RebaselineTracker;

pub const MANAGER_EXPORT: &str = "larch-operator/export";
pub const MANAGER_SOURCE: &str = "larch-operator/source";
pub const MANAGER_SOURCE_SET: &str = "larch-operator/source-set";

pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

pub struct Context {
    pub client: Client,
    pub build: BuildContext,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    pub prober: Arc<dyn Prober>,
    /// Re-baseline trackers by `namespace/name` of the ArchiveSource.
    pub trackers: Mutex<HashMap<String, RebaselineTracker>>,
    pub clock: Clock,
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
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            build: BuildContext { image },
            metrics,
            prober,
            trackers: Mutex::default(),
            clock: Arc::new(Timestamp::now),
        }
    }

    pub fn now(&self) -> Timestamp {
        (self.clock)()
    }
}

/// Reconcile errors; the variant name is the `error` label of the error metric.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("object has no namespace")]
    NoNamespace,
}

impl Error {
    pub fn label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "Kube",
            Error::NoNamespace => "NoNamespace",
        }
    }
}
