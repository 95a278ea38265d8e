//! Objects under an archive's key prefix that its committed manifest does not reference (W10):
//! left by a writer that died between an upload and its manifest swap, or between a swap that
//! pruned an epoch and the deletion of that epoch's objects.
//!
//! Nothing here depends on clocks agreeing between machines: an object's age is judged against
//! the manifest *object's* modification time, both read from the store's own clock, never
//! against the `updated_at` a writer's clock put into the manifest (a writer whose clock runs
//! ahead made `gc --delete` remove an upload it was about to commit; issue 14). A writer only
//! commits what it uploaded after the manifest revision it holds, so an unreferenced object
//! stored *before* the current manifest can no longer be committed by anyone, and only such
//! objects are candidates:
//!
//! * an **orphan** is one of an epoch *below* the manifest's current epoch that the manifest no
//!   longer lists (uploads in progress are of the current epoch or the next): the writer's
//!   sweep and `larch archive gc --delete` remove it;
//! * one of a listed epoch or of an epoch the manifest has not reached yet is reported and kept;
//!   `gc --include-listed-epochs` removes it once no writer runs;
//! * one stored at or after the manifest (or undated) is always kept: a writer may be about to
//!   commit it.
//!
//! Objects whose names are not artifact keys are never touched.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::error::{ArchiveError, Result};
use super::format::Format;
use super::manifest::{Manifest, manifest_key, referenced_keys};
use super::store::Store;

/// The coarsest modification time a store reports (S3: whole seconds). A writer that commits
/// this long after it opened stores its manifest after every upload of a writer that died
/// before it started, by the store's clock.
pub const STORE_TIME_RESOLUTION: Duration = Duration::from_secs(1);

/// Why an unreferenced object may or may not be deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unreferenced {
    /// Stored before the manifest, of an epoch below the manifest's that it no longer lists: an
    /// orphan, safe to delete.
    Orphan,
    /// Stored before the manifest, of an epoch the manifest lists or has not reached yet (an
    /// upload whose commit never happened): kept by the sweep.
    ListedEpoch,
    /// Not stored before the manifest by the store's clock (or undated): a writer may be
    /// committing it right now.
    TooNew,
}

impl Unreferenced {
    pub fn describe(self) -> &'static str {
        match self {
            Unreferenced::Orphan => {
                "orphan: its epoch is below the manifest's and no longer listed"
            }
            Unreferenced::ListedEpoch => {
                "unreferenced upload in a listed or later epoch (kept; gc --include-listed-epochs)"
            }
            Unreferenced::TooNew => {
                "not stored before the manifest (store clock): a writer may be committing it (kept)"
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

/// Every object of the prefix's artifact key space that `manifest` (the committed manifest just
/// read from `store`) does not reference, classified. An object counts as stored before the
/// manifest when its modification time is more than `margin` before the manifest object's,
/// both by the store's clock (zero is right for every store: the times are the same clock's).
pub async fn find_unreferenced(
    store: &dyn Store,
    key_prefix: &str,
    manifest: &Manifest,
    margin: Duration,
) -> Result<Vec<UnreferencedObject>> {
    let referenced = referenced_keys(key_prefix, &manifest.artifacts);
    let listed: BTreeSet<i64> = manifest.artifacts.iter().map(|a| a.epoch).collect();
    let key = manifest_key(key_prefix);
    let stored_at = store
        .head(&key)
        .await?
        .ok_or(ArchiveError::ManifestNotFound { key: key.clone() })?
        .modified;
    let older_than =
        stored_at.map(|t| t - chrono::Duration::from_std(margin).unwrap_or(chrono::Duration::MAX));
    let mut out = Vec::new();
    for obj in store.list(&format!("{key_prefix}epoch=")).await? {
        let Some(epoch) = artifact_epoch(key_prefix, &obj.key) else {
            continue;
        };
        if referenced.contains(&obj.key) {
            continue;
        }
        let before_manifest = matches!((obj.modified, older_than), (Some(m), Some(t)) if m < t);
        let class = if !before_manifest {
            Unreferenced::TooNew
        } else if epoch < manifest.epoch && !listed.contains(&epoch) {
            Unreferenced::Orphan
        } else {
            Unreferenced::ListedEpoch
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
    let found = find_unreferenced(store, key_prefix, manifest, Duration::ZERO).await?;
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
