//! How a consumer at a position continues on a manifest (C1): up to date, the diffs to
//! deliver, a short chain to wait at, or a re-baseline.

use larch_archive::manifest::{Artifact, Manifest};
use larch_archive::plan::{ShortChain, chain_from, newest_snapshot, plan, plan_head, short_chain};
use larch_archive::position::same;

/// What the manifest says about a consumer at `from`.
#[derive(Debug)]
pub(super) enum Step {
    UpToDate,
    Diffs(Vec<Artifact>),
    Replaced(String),
    /// At the end of the newest snapshot's chain, which stops before the head: nothing to do
    /// until a writer repairs the chain or writes a new epoch.
    Short(ShortChain),
}

/// Decides how a consumer at `from` (on `epoch`, when known) continues on `manifest` (C1).
pub(super) fn next_step(manifest: &Manifest, from: &str, epoch: Option<i64>) -> Step {
    let newest = newest_snapshot(manifest);
    if same(from, &manifest.head_position) || (from.is_empty() && newest.is_none()) {
        let Some(snap) = newest else {
            return Step::UpToDate;
        };
        if epoch == Some(snap.epoch) {
            return Step::UpToDate;
        }
        // A new epoch whose head is our position: fine only if its lineage contains us.
        let on_lineage = same(&snap.to_position, from)
            || chain_from(manifest, &snap.to_position, None)
                .iter()
                .any(|d| same(&d.to_position, from));
        return if on_lineage {
            Step::UpToDate
        } else {
            Step::Replaced(format!(
                "epoch {} (snapshot at {:?}) replaced the archive at our position {from:?}",
                snap.epoch, snap.to_position
            ))
        };
    }
    let head_plan = plan_head(manifest);
    if let Some(short) = short_chain(manifest, &head_plan) {
        if same(from, &short.reached) {
            return Step::Short(short);
        }
        // Behind on the short chain: walk it as far as it goes.
        let chain = chain_from(manifest, from, None);
        if chain
            .last()
            .is_some_and(|d| same(&d.to_position, &short.reached))
        {
            return Step::Diffs(chain.into_iter().cloned().collect());
        }
    }
    match plan(manifest, from) {
        Some(p) if p.snapshot.is_none() => Step::Diffs(p.diffs),
        Some(p) => Step::Replaced(format!(
            "head {:?} (epoch {}) does not continue our position {from:?}: the newest snapshot is at {:?}",
            manifest.head_position,
            manifest.epoch,
            p.snapshot.map(|s| s.to_position).unwrap_or_default()
        )),
        None => Step::Replaced(format!(
            "the archive at head {:?} has no snapshot and no chain from our position {from:?}",
            manifest.head_position
        )),
    }
}
