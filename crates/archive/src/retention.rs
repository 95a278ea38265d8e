//! Retention (W7): which epochs a manifest commit prunes. The writer applies it to the manifest it
//! is about to commit and deletes the pruned epochs' objects only after that commit (W10), in
//! every mode: a one-shot run prunes after its own snapshot commit, a continuous writer after
//! each diff or snapshot commit.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, FixedOffset};

use super::manifest::{Artifact, ArtifactKind};

/// How many epochs, or how much history, to keep. The current epoch is always kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// Keep this many newest epochs (0: no limit).
    pub keep_epochs: u32,
    /// Keep every epoch needed to reconstruct any position of the last `max_age`: an epoch is
    /// pruned once the next epoch's snapshot is older than this (`None`: no limit).
    pub max_age: Option<Duration>,
}

impl Retention {
    pub fn is_unlimited(&self) -> bool {
        self.keep_epochs == 0 && self.max_age.is_none()
    }
}

/// Splits `artifacts` into (kept, pruned) for a manifest whose current epoch is `current`.
/// An epoch goes when either rule says so; artifacts of the current epoch (or newer) never do.
pub fn prune(
    artifacts: Vec<Artifact>,
    current: i64,
    retention: &Retention,
    now: DateTime<FixedOffset>,
) -> (Vec<Artifact>, Vec<Artifact>) {
    if retention.is_unlimited() {
        return (artifacts, Vec::new());
    }
    let too_many = |epoch: i64| {
        retention.keep_epochs > 0 && epoch < current - i64::from(retention.keep_epochs) + 1
    };
    let ended = epoch_ends(&artifacts);
    let too_old = |epoch: i64| match (retention.max_age, ended.get(&epoch)) {
        (Some(age), Some(end)) => chrono::Duration::from_std(age)
            .ok()
            .and_then(|age| now.checked_sub_signed(age))
            .is_some_and(|cutoff| *end < cutoff),
        _ => false,
    };
    artifacts
        .into_iter()
        .partition(|a| a.epoch >= current || !(too_many(a.epoch) || too_old(a.epoch)))
}

/// When each epoch stopped being the newest: the earliest snapshot of any later epoch. The
/// newest epoch has no end.
fn epoch_ends(artifacts: &[Artifact]) -> BTreeMap<i64, DateTime<FixedOffset>> {
    let mut starts: BTreeMap<i64, DateTime<FixedOffset>> = BTreeMap::new();
    for a in artifacts
        .iter()
        .filter(|a| a.kind == ArtifactKind::Snapshot)
    {
        starts
            .entry(a.epoch)
            .and_modify(|t| *t = (*t).min(a.created_at))
            .or_insert(a.created_at);
    }
    let mut epochs: Vec<i64> = artifacts.iter().map(|a| a.epoch).collect();
    epochs.sort_unstable();
    epochs.dedup();
    let mut ends = BTreeMap::new();
    let mut earliest_later: Option<DateTime<FixedOffset>> = None;
    for e in epochs.into_iter().rev() {
        if let Some(t) = earliest_later {
            ends.insert(e, t);
        }
        if let Some(s) = starts.get(&e) {
            earliest_later = Some(earliest_later.map_or(*s, |t| t.min(*s)));
        }
    }
    ends
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An artifact created `hours_ago` before [`now`].
    fn art(kind: ArtifactKind, epoch: i64, hours_ago: i64) -> Artifact {
        Artifact {
            created_at: now() - chrono::Duration::hours(hours_ago),
            ..crate::fixtures::art(kind, epoch, None, &format!("0/{epoch}{hours_ago}"))
        }
    }

    fn now() -> DateTime<FixedOffset> {
        DateTime::parse_from_rfc3339("2026-12-01T12:00:00Z").unwrap()
    }

    fn epochs(v: &[Artifact]) -> Vec<i64> {
        let mut e: Vec<i64> = v.iter().map(|a| a.epoch).collect();
        e.dedup();
        e
    }

    /// Four daily epochs (a snapshot and a diff each), the newest one hour old.
    fn daily() -> Vec<Artifact> {
        (1..=4)
            .flat_map(|e| {
                let start = (4 - e) * 24 + 1;
                [
                    art(ArtifactKind::Snapshot, e, start),
                    art(ArtifactKind::Diff, e, start - 1),
                ]
            })
            .collect()
    }

    #[test]
    fn keep_epochs_keeps_the_newest_n() {
        let r = Retention {
            keep_epochs: 2,
            max_age: None,
        };
        let (kept, pruned) = prune(daily(), 4, &r, now());
        assert_eq!(epochs(&kept), [3, 4]);
        assert_eq!(epochs(&pruned), [1, 2]);
        assert_eq!(pruned.len(), 4, "snapshots and diffs of pruned epochs go");
    }

    #[test]
    fn max_age_keeps_what_covers_the_window() {
        // Epoch 2 ended when epoch 3 started, 25 h ago: with 30 h it still covers the window.
        let r = Retention {
            keep_epochs: 0,
            max_age: Some(Duration::from_secs(30 * 3600)),
        };
        let (kept, pruned) = prune(daily(), 4, &r, now());
        assert_eq!(epochs(&kept), [2, 3, 4]);
        assert_eq!(epochs(&pruned), [1]);
        // A tiny max age still keeps the current epoch.
        let r = Retention {
            keep_epochs: 0,
            max_age: Some(Duration::from_secs(1)),
        };
        let (kept, _) = prune(daily(), 4, &r, now());
        assert_eq!(epochs(&kept), [4]);
    }

    #[test]
    fn either_rule_prunes_and_nothing_is_the_default() {
        let r = Retention {
            keep_epochs: 3,
            max_age: Some(Duration::from_secs(30 * 3600)),
        };
        let (kept, _) = prune(daily(), 4, &r, now());
        assert_eq!(epochs(&kept), [2, 3, 4]);
        let r = Retention {
            keep_epochs: 1,
            max_age: Some(Duration::from_secs(1000 * 3600)),
        };
        assert_eq!(epochs(&prune(daily(), 4, &r, now()).0), [4]);
        let (kept, pruned) = prune(daily(), 4, &Retention::default(), now());
        assert_eq!((kept.len(), pruned.len()), (8, 0));
    }

    #[test]
    fn an_old_current_epoch_is_kept() {
        // One epoch, its snapshot a year old: nothing newer ended it.
        let arts = vec![
            art(ArtifactKind::Snapshot, 7, 24 * 365),
            art(ArtifactKind::Diff, 7, 1),
        ];
        let r = Retention {
            keep_epochs: 1,
            max_age: Some(Duration::from_secs(60)),
        };
        let (kept, pruned) = prune(arts, 7, &r, now());
        assert_eq!((kept.len(), pruned.len()), (2, 0));
    }
}
