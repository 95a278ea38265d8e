//! The Kubernetes operator: CRD types, pure builders of child objects, condition computation and
//! the controllers. It never links the export or engine internals: the pods it creates run the
//! `larch` binary (`larch export`, `larch engine`) with the CLI contract in `docs/operator.md`;
//! what it knows of their failures is the termination-message contract of [`larch_core::failure`].

pub mod builders;
pub mod conditions;
pub mod controllers;
pub mod crd;
pub mod cron;
pub mod dereference;
pub mod metrics;
pub mod observe;
pub mod pod_failure;
pub mod probe;
pub mod progress;
pub mod rebaseline;
pub mod seed_head;
pub mod server;
pub mod time;
pub mod validate;
