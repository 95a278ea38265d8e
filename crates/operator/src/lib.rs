//! The Kubernetes operator: CRD types, pure builders of child objects, condition computation and
//! the controllers. It never links the export or engine internals: the pods it creates run the
//! `larch` binary (`larch export`, `larch engine`) with the CLI contract in `docs/operator.md`;
//! what it knows of their failures is the termination-message contract of [`larch_core::failure`].
//!
//! One folder per kind ([`export`], [`source`], [`source_set`], [`restore`]) holds that kind's
//! reconcile, builders, conditions and tests; [`reconcile`] holds the machinery they share
//! (applying children, context, status writing, the controller runner) and [`builders`] the
//! builder helpers they share (labels, owner references, pod templates, the engine config).

pub mod builders;
pub mod crd;
pub mod cron;
pub mod export;
pub mod metrics;
pub mod reconcile;
pub mod restore;
pub mod server;
pub mod source;
pub mod source_set;
pub mod time;

/// Paths the `larch` binary and the workspace's tests name, from before the operator was
/// sorted by kind (`controllers::run`, `probe::HttpProber`, `progress::export_progress`).
pub mod controllers {
    pub use crate::export::lease_rights;
    pub use crate::reconcile::context;
    pub use crate::reconcile::runner::run;
}
pub use reconcile::{probe, progress};
