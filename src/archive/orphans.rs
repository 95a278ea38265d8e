//! Objects under an archive's key prefix that its committed manifest does not reference (W10):
//! left by a writer that died between an upload and its manifest swap, or between a swap that
//! pruned an epoch and the deletion of that epoch's objects.
//!
//! Only an *orphan* is ever swept: an unreferenced artifact object of an epoch the manifest no
//! longer lists, last modified before the manifest's `updated_at` by more than the clock
//! allowance ([`CLOCK_ALLOWANCE`]: S3 reports seconds only, and the store's clock is not the
//! writer's). An unreferenced object of a
//! listed epoch, or one newer than the manifest (another writer may be about to commit it), is
//! reported but left alone; `larch archive gc --include-listed-epochs` removes the former once
//! no writer runs. Objects whose names are not artifact keys are never touched.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::error::Result;
use super::format::Format;
use super::manifest::{Manifest, referenced_keys};
use super::store::Store;

/// How much older than the manifest an object must look before it counts as older: S3's
/// `LastModified` has whole seconds, and the store's clock and the writer's may disagree.
pub const CLOCK_ALLOWANCE: Duration = Duration::from_secs(5);

/// Why an unreferenced object may or may not be deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unreferenced {
    /// Its epoch is no longer listed and it predates the manifest: an orphan, safe to delete.
    Orphan,
    /// Its epoch is still listed (an upload whose commit never happened): kept by the sweep.
    ListedEpoch,
    /// Not older than the manifest's `updated_at` by the clock allowance (or undated): a
    /// writer may be committing it right now.
    TooNew,
}

impl Unreferenced {
    pub fn describe(self) -> &'static str {
        match self {
            Unreferenced::Orphan => "orphan: its epoch is no longer listed",
            Unreferenced::ListedEpoch => {
                "unreferenced upload in a listed epoch (kept; gc --include-listed-epochs)"
            }
            Unreferenced::TooNew => {
                "not older than the manifest (within the clock allowance): a writer may be committing it (kept)"
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnreferencedObject {
    pub key: String,
    pub epoch: i64,
    pub size: u64,
    pub modified: Option<DateTime<Utc>>,
    pub class: Unreferenced,
}

/// `epoch=<n>/(snapshot|diff)-…<known extension>` under the key prefix: the epoch, else `None`.
fn artifact_epoch(key_prefix: &str, key: &str) -> Option<i64> {
    let rest = key.strip_prefix(key_prefix)?.strip_prefix("epoch=")?;
    let (epoch, name) = rest.split_once('/')?;
    if name.contains('/') || !(name.starts_with("snapshot-") || name.starts_with("diff-")) {
        return None;
    }
    if !Format::ALL.iter().any(|f| name.ends_with(f.extension())) {
        return None;
    }
    epoch.parse().ok()
}

/// Every object of the prefix's artifact key space that `manifest` does not reference,
/// classified; an object counts as older than the manifest when modified more than
/// `allowance` before its `updated_at`.
pub async fn find_unreferenced(
    store: &dyn Store,
    key_prefix: &str,
    manifest: &Manifest,
    allowance: Duration,
) -> Result<Vec<UnreferencedObject>> {
    let referenced = referenced_keys(key_prefix, &manifest.artifacts);
    let listed: BTreeSet<i64> = manifest.artifacts.iter().map(|a| a.epoch).collect();
    let older_than = manifest.updated_at.with_timezone(&Utc)
        - chrono::Duration::from_std(allowance).unwrap_or(chrono::Duration::MAX);
    let mut out = Vec::new();
    for obj in store.list(&format!("{key_prefix}epoch=")).await? {
        let Some(epoch) = artifact_epoch(key_prefix, &obj.key) else {
            continue;
        };
        if referenced.contains(&obj.key) {
            continue;
        }
        let class = match obj.modified {
            Some(m) if m < older_than => {
                if listed.contains(&epoch) {
                    Unreferenced::ListedEpoch
                } else {
                    Unreferenced::Orphan
                }
            }
            _ => Unreferenced::TooNew,
        };
        out.push(UnreferencedObject {
            key: obj.key,
            epoch,
            size: obj.size,
            modified: obj.modified,
            class,
        });
    }
    Ok(out)
}

/// Deletes the unreferenced objects whose class is in `classes`; returns the keys deleted.
/// `manifest` must be the committed manifest just read (or just written) from `store`.
pub async fn remove(
    store: &dyn Store,
    found: &[UnreferencedObject],
    classes: &[Unreferenced],
) -> Result<Vec<String>> {
    let mut deleted = Vec::new();
    for o in found.iter().filter(|o| classes.contains(&o.class)) {
        store.delete(&o.key).await?;
        deleted.push(o.key.clone());
    }
    Ok(deleted)
}

/// The writer's sweep (W10): deletes orphans only.
pub async fn sweep(
    store: &dyn Store,
    key_prefix: &str,
    manifest: &Manifest,
) -> Result<Vec<String>> {
    let found = find_unreferenced(store, key_prefix, manifest, CLOCK_ALLOWANCE).await?;
    remove(store, &found, &[Unreferenced::Orphan]).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_artifact_keys_of_the_prefix_have_an_epoch() {
        let p = "public.events/";
        assert_eq!(
            artifact_epoch(p, "public.events/epoch=3/snapshot-0_19F000.jsonl"),
            Some(3)
        );
        assert_eq!(
            artifact_epoch(p, "public.events/epoch=12/diff-start-0_1.pb"),
            Some(12)
        );
        assert_eq!(artifact_epoch(p, "public.events/manifest.json"), None);
        assert_eq!(artifact_epoch(p, "public.events/epoch=3/notes.txt"), None);
        assert_eq!(
            artifact_epoch(p, "public.events/epoch=x/diff-1-2.jsonl"),
            None
        );
        assert_eq!(
            artifact_epoch(p, "public.events/epoch=3/sub/diff-1-2.jsonl"),
            None
        );
        assert_eq!(artifact_epoch(p, "other/epoch=3/diff-1-2.jsonl"), None);
    }
}
