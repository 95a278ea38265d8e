//! Committing an artifact: the manifest compare-and-swapped onto every store in order, then
//! retention's deletions and the orphan sweep (W5–W7, W10).

use bytes::Bytes;

use super::ArchiveWriter;
use crate::error::{ArchiveError, Result};
use crate::format::Format;
use crate::manifest::{Artifact, artifact_key, manifest_key, object_keys, referenced_keys};

impl ArchiveWriter {
    /// Appends the artifact to a copy of the manifest, prunes, and compare-and-swaps it onto
    /// every store in order; adopts it only when every store took it. Then deletes the objects
    /// of pruned artifacts (W7).
    pub(super) async fn commit(
        &mut self,
        artifact: Artifact,
        new_epoch: Option<i64>,
    ) -> Result<()> {
        let mut next = self.manifest.clone();
        next.manifest_version = crate::manifest::MANIFEST_VERSION;
        next.table = self.config.table.clone();
        if let Some(e) = new_epoch {
            next.epoch = e;
        }
        next.updated_at = self.config.clock.now();
        next.head_position = artifact.to_position.clone();
        next.artifacts.push(artifact);
        let retention = crate::retention::Retention {
            keep_epochs: self.config.keep_epochs,
            max_age: self.config.max_age,
        };
        let (kept, pruned) = crate::retention::prune(
            std::mem::take(&mut next.artifacts),
            next.epoch,
            &retention,
            next.updated_at,
        );
        next.artifacts = kept;
        let bytes = Bytes::from(next.to_json());
        let key = manifest_key(&self.config.key_prefix);
        crate::crashpoint::crash_point(crate::crashpoint::WRITER_AFTER_UPLOAD);
        self.check_uploads(next.artifacts.last().expect("just pushed"))
            .await?;
        for (i, store) in self.stores.iter().enumerate() {
            match store.put_cas(&key, bytes.clone(), &self.revisions[i]).await {
                Ok(rev) => self.revisions[i] = rev,
                Err(ArchiveError::CasConflict { .. }) => {
                    return Err(ArchiveError::CasConflict {
                        key: format!("{key} on {}", store.name()),
                    });
                }
                Err(e) => return Err(e),
            }
        }
        self.manifest = next;
        crate::crashpoint::crash_point(crate::crashpoint::WRITER_AFTER_COMMIT);
        self.delete_artifacts(&pruned).await;
        let first_due = self.sweep_after_commit
            && self.opened_at.elapsed() > crate::orphans::STORE_TIME_RESOLUTION;
        if first_due || new_epoch.is_some() || !pruned.is_empty() {
            if first_due {
                self.sweep_after_commit = false;
            }
            self.sweep_orphans().await;
        }
        Ok(())
    }

    /// Right before the manifest swap: every object of `artifact` is on every store with the
    /// size uploaded. Whatever removed one in between (a `gc --delete` judging by a skewed clock,
    /// an operator's `rm`) would otherwise make the commit point at nothing.
    async fn check_uploads(&self, artifact: &Artifact) -> Result<()> {
        for (format, entry) in &artifact.formats {
            let ext = Format::parse(format)?.extension();
            let key = artifact_key(&self.config.key_prefix, artifact, ext);
            for store in &self.stores {
                match store.head(&key).await? {
                    Some(o) if o.size as i64 == entry.size_bytes => {}
                    found => {
                        return Err(ArchiveError::Invalid(format!(
                            "{key} on {}: {} before the manifest commit (uploaded {} B); not \
                             committing (was it deleted by `larch archive gc` or by hand?)",
                            store.name(),
                            match found {
                                Some(o) => format!("{} B", o.size),
                                None => "gone".into(),
                            },
                            entry.size_bytes
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    async fn delete_artifacts(&self, artifacts: &[Artifact]) {
        let live = referenced_keys(&self.config.key_prefix, &self.manifest.artifacts);
        for a in artifacts {
            for key in object_keys(&self.config.key_prefix, a) {
                if live.contains(&key) {
                    continue; // sanitised keys can collide (laredo §2.1): never delete a live object
                }
                for store in &self.stores {
                    if let Err(e) = store.delete(&key).await {
                        tracing::warn!(key = %key, store = %store.name(), error = %e, "retention could not delete a pruned object; it stays as an orphan");
                    }
                }
            }
        }
    }
}
