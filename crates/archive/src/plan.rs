//! Planning reads over a manifest (rules R3 and R7): chain walks that always terminate.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

use super::error::{ArchiveError, Result};
use super::manifest::{Artifact, ArtifactKind, Manifest};
use super::position::{self, canonical, compare};

/// What to read: an optional base snapshot, then diffs in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub snapshot: Option<Artifact>,
    pub diffs: Vec<Artifact>,
    /// The position the plan reaches.
    pub head_position: String,
}

/// Why a diff cannot be followed (reported by `archive verify`).
pub fn broken_link_reason(diff: &Artifact) -> Option<String> {
    let from = diff.from_position.as_deref().unwrap_or("");
    if !position::is_valid(&diff.to_position) {
        return Some(format!(
            "to_position {:?} is not a valid position",
            diff.to_position
        ));
    }
    if compare(&diff.to_position, from) != Ordering::Greater {
        return Some(format!(
            "to_position {:?} does not advance past from_position {:?}",
            diff.to_position, from
        ));
    }
    None
}

/// Walks the diff chain from `start` (R3): the diff whose `from` is the current position
/// (later in manifest order wins), accepted only if it advances to a valid, greater position.
/// `limit` stops before the first diff whose `to` is past it.
pub fn chain_from<'m>(
    manifest: &'m Manifest,
    start: &str,
    limit: Option<&str>,
) -> Vec<&'m Artifact> {
    let mut by_from: HashMap<String, &Artifact> = HashMap::new();
    for a in manifest
        .artifacts
        .iter()
        .filter(|a| a.kind == ArtifactKind::Diff)
    {
        if let Some(from) = &a.from_position {
            by_from.insert(canonical(from), a);
        }
    }
    let mut chain = Vec::new();
    let mut seen = HashSet::new();
    let mut current = canonical(start);
    while let Some(d) = by_from.get(&current) {
        if broken_link_reason(d).is_some() {
            break;
        }
        if let Some(limit) = limit
            && compare(&d.to_position, limit) == Ordering::Greater
        {
            break;
        }
        let next = canonical(&d.to_position);
        if !seen.insert(next.clone()) {
            break;
        }
        chain.push(*d);
        current = next;
    }
    chain
}

/// The newest snapshot: highest epoch, ties to the first in manifest order.
pub fn newest_snapshot(manifest: &Manifest) -> Option<&Artifact> {
    let mut best: Option<&Artifact> = None;
    for s in manifest.snapshots() {
        if best.is_none_or(|b| s.epoch > b.epoch) {
            best = Some(s);
        }
    }
    best
}

/// `plan(from)` (R7): diff-only when a chain from `from` reaches the head, else the newest
/// snapshot plus its chain. `None` when the archive has no snapshot to start from.
pub fn plan(manifest: &Manifest, from: &str) -> Option<Plan> {
    if !from.is_empty() {
        let chain = chain_from(manifest, from, None);
        if let Some(last) = chain.last()
            && compare(&last.to_position, &manifest.head_position) != Ordering::Less
        {
            return Some(Plan {
                snapshot: None,
                head_position: last.to_position.clone(),
                diffs: chain.into_iter().cloned().collect(),
            });
        }
    }
    let snapshot = newest_snapshot(manifest)?;
    let chain = chain_from(manifest, &snapshot.to_position, None);
    Some(Plan {
        head_position: chain
            .last()
            .map(|d| d.to_position.clone())
            .unwrap_or_else(|| snapshot.to_position.clone()),
        snapshot: Some(snapshot.clone()),
        diffs: chain.into_iter().cloned().collect(),
    })
}

/// The plan for the head: the newest snapshot and its whole chain. An archive without any
/// artifact yields an empty plan at the manifest's head.
pub fn plan_head(manifest: &Manifest) -> Plan {
    plan(manifest, "").unwrap_or(Plan {
        snapshot: None,
        diffs: Vec::new(),
        head_position: manifest.head_position.clone(),
    })
}

/// A head plan whose diff chain stops before the manifest's head: reading it gives an older
/// state than the archive claims to hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShortChain {
    /// The position the chain reaches.
    pub reached: String,
    /// The manifest's `head_position`.
    pub head: String,
    /// Why the walk stopped at `reached`.
    pub reason: String,
}

impl std::fmt::Display for ShortChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the diff chain stops at {} before the manifest head {}: {}",
            self.reached, self.head, self.reason
        )
    }
}

/// `Some` when `plan` (a [`plan_head`] of `manifest`) does not reach the manifest's head.
pub fn short_chain(manifest: &Manifest, plan: &Plan) -> Option<ShortChain> {
    if plan.snapshot.is_none() || position::same(&plan.head_position, &manifest.head_position) {
        return None;
    }
    let at = canonical(&plan.head_position);
    let next = manifest
        .artifacts
        .iter()
        .filter(|a| a.kind == ArtifactKind::Diff)
        .rfind(|a| a.from_position.as_deref().map(canonical).as_deref() == Some(at.as_str()));
    let reason = match next {
        None => format!("no diff starts at {}", plan.head_position),
        Some(d) => match broken_link_reason(d) {
            Some(r) => format!("the diff from {} is broken ({r})", plan.head_position),
            None => format!(
                "the diff from {} to {} leads back into the chain",
                plan.head_position, d.to_position
            ),
        },
    };
    Some(ShortChain {
        reached: plan.head_position.clone(),
        head: manifest.head_position.clone(),
        reason,
    })
}

/// `plan_as_of(p)` (R7): the snapshot with the greatest position ≤ p plus the chain up to p
/// (a straddling diff is excluded); past the head clamps to the head.
pub fn plan_as_of(manifest: &Manifest, at: &str) -> Result<Plan> {
    if !position::is_valid(at) {
        return Err(ArchiveError::InvalidPosition(at.to_string()));
    }
    let mut base: Option<&Artifact> = None;
    for s in manifest.snapshots() {
        if compare(&s.to_position, at) != Ordering::Greater
            && base.is_none_or(|b| compare(&s.to_position, &b.to_position) == Ordering::Greater)
        {
            base = Some(s);
        }
    }
    let Some(base) = base else {
        let oldest = manifest
            .snapshots()
            .map(|s| s.to_position.as_str())
            .min_by(|a, b| compare(a, b))
            .unwrap_or("")
            .to_string();
        return Err(ArchiveError::Predates {
            position: at.to_string(),
            oldest,
        });
    };
    let chain = chain_from(manifest, &base.to_position, Some(at));
    Ok(Plan {
        head_position: chain
            .last()
            .map(|d| d.to_position.clone())
            .unwrap_or_else(|| base.to_position.clone()),
        snapshot: Some(base.clone()),
        diffs: chain.into_iter().cloned().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{art, manifest};

    #[test]
    fn plans_follow_laredo() {
        let m = manifest(
            vec![
                art(ArtifactKind::Snapshot, 1, None, "0/10"),
                art(ArtifactKind::Diff, 1, Some("0/10"), "0/20"),
                art(ArtifactKind::Diff, 1, Some("0/20"), "0/30"),
            ],
            "0/30",
        );
        let p = plan(&m, "0/5").unwrap();
        assert!(p.snapshot.is_some());
        assert_eq!(p.diffs.len(), 2);
        let p = plan(&m, "0/10").unwrap();
        assert!(p.snapshot.is_none());
        assert_eq!(p.diffs.len(), 2);
        let p = plan(&m, "0/020").unwrap(); // another spelling of 0/20 links (R2)
        assert_eq!(p.diffs.len(), 1);
        assert_eq!(plan_as_of(&m, "0/10").unwrap().diffs.len(), 0);
        assert_eq!(plan_as_of(&m, "0/25").unwrap().head_position, "0/20");
        assert_eq!(plan_as_of(&m, "0/99").unwrap().head_position, "0/30");
        let e = plan_as_of(&m, "0/1").unwrap_err();
        assert!(e.to_string().contains("predates"), "{e}");
        assert!(matches!(
            plan_as_of(&m, "bogus"),
            Err(ArchiveError::InvalidPosition(_))
        ));
    }

    #[test]
    fn cycles_and_stuck_links_terminate() {
        let m = manifest(
            vec![
                art(ArtifactKind::Snapshot, 1, None, "0/10"),
                art(ArtifactKind::Diff, 1, Some("0/10"), "<nil>"),
                art(ArtifactKind::Diff, 1, Some("<nil>"), "<nil>"),
            ],
            "<nil>",
        );
        let p = plan_head(&m);
        assert!(p.diffs.is_empty());
        let m = manifest(
            vec![
                art(ArtifactKind::Snapshot, 1, None, "0/10"),
                art(ArtifactKind::Diff, 1, Some("0/10"), "0/10"),
                art(ArtifactKind::Diff, 1, Some("0/20"), "0/10"),
            ],
            "0/20",
        );
        assert!(plan_head(&m).diffs.is_empty());
    }

    #[test]
    fn a_chain_that_stops_before_the_head_is_short() {
        let mut m = manifest(
            vec![
                art(ArtifactKind::Snapshot, 1, None, "0/10"),
                art(ArtifactKind::Diff, 1, Some("0/10"), "0/20"),
                // 0/20 -> 0/30 is missing
                art(ArtifactKind::Diff, 1, Some("0/30"), "0/40"),
            ],
            "0/40",
        );
        let s = short_chain(&m, &plan_head(&m)).unwrap();
        assert_eq!((s.reached.as_str(), s.head.as_str()), ("0/20", "0/40"));
        assert!(s.reason.contains("no diff starts at 0/20"), "{s}");
        m.artifacts
            .push(art(ArtifactKind::Diff, 1, Some("0/020"), "0/15"));
        let s = short_chain(&m, &plan_head(&m)).unwrap();
        assert!(s.reason.contains("broken"), "{s}");
        m.artifacts
            .push(art(ArtifactKind::Diff, 1, Some("0/20"), "0/30"));
        assert_eq!(short_chain(&m, &plan_head(&m)), None);
        // No snapshot: nothing to read, nothing short.
        let empty = manifest(vec![], "0/5");
        assert_eq!(short_chain(&empty, &plan_head(&empty)), None);
    }

    #[test]
    fn empty_archive_plans_nothing() {
        let m = manifest(vec![], "");
        assert!(plan(&m, "").is_none());
        assert_eq!(plan_head(&m).head_position, "");
    }
}
