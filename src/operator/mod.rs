//! The Kubernetes operator: CRD types, pure builders of child objects, condition computation and
//! the controllers. It never links the export or engine internals: the pods it creates run the
//! `larch` binary (`larch export`, `larch engine`) with the CLI contract in `docs/operator.md`.

pub mod builders;
pub mod cli;
pub mod conditions;
pub mod controllers;
pub mod crd;
pub mod metrics;
pub mod observe;
pub mod probe;
pub mod rebaseline;
pub mod server;
