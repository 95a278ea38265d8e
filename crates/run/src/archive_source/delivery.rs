//! Reading the archive for the engine: the head's rows for a baseline, the diffs after a
//! position as change events, and the `require_transformed` check both make.

use tokio::sync::mpsc;

use larch_archive::fold::{head_rows, is_stopped};
use larch_archive::manifest::{Artifact, Manifest};
use larch_archive::model::TableId;
use larch_archive::plan::{Plan, ShortChain, chain_from, newest_snapshot, plan};
use larch_archive::point_in_time::{Resolution, resolve};
use larch_archive::position::same;
use larch_archive::source::{SourceError, SourceEvent};
use larch_archive::value::Row;
use larch_core::locks::MutexExt;

use super::{ArchiveReplaySource, Behind, change_event};

impl ArchiveReplaySource {
    /// `require_transformed`: the manifest records a transform that masks something and covers
    /// every column it serves (`TransformRecord::uncovered`); else an error tagged
    /// `ArchiveNotTransformed` naming the table and the uncovered columns.
    pub(super) fn check_transformed(&self, m: &Manifest) -> anyhow::Result<()> {
        if !self.opts.require_transformed && !self.opts.require_leak_check {
            return Ok(());
        }
        let (id, key, table) = (&self.opts.id, self.reader.manifest_key(), &self.opts.table);
        let Some(t) = m.transform.as_ref().filter(|t| t.masks_anything()) else {
            larch_core::failure::bail!(
                larch_core::failure::Reason::ArchiveNotTransformed,
                "source {id}: require_transformed: the archive {key} (table {table}) records no \
                 masking transform (it was not exported with --transform / spec.transform): \
                 refusing to load raw rows",
            );
        };
        let uncovered = t.uncovered(m.columns.iter().map(|c| c.name.as_str()));
        if !uncovered.is_empty() {
            larch_core::failure::bail!(
                larch_core::failure::Reason::ArchiveNotTransformed,
                "source {id}: require_transformed: epoch {} of the archive {key} (table {table}) \
                 serves columns its transform does not cover: {} (neither named in the rules \
                 nor masked by `undeclared`, which is {:?}): refusing to load raw rows",
                m.epoch,
                uncovered.join(", "),
                t.undeclared,
            );
        }
        if self.opts.require_leak_check {
            self.check_leak_check(m, t)?;
        }
        Ok(())
    }

    /// `require_leak_check`: `transform.leak_check` records a check that found nothing at the
    /// manifest's epoch and head.
    fn check_leak_check(
        &self,
        m: &Manifest,
        t: &larch_archive::masking::TransformRecord,
    ) -> anyhow::Result<()> {
        let (id, key, table) = (&self.opts.id, self.reader.manifest_key(), &self.opts.table);
        let why = match &t.leak_check {
            None => "records no leak check (run `larch archive leak-check`)".to_string(),
            Some(c) if c.found > 0 => format!(
                "records a failed leak check: {} raw values found at {} (epoch {})",
                c.found, c.position, c.epoch
            ),
            Some(c) if !c.passed_at(m.epoch, &m.head_position) => format!(
                "records a leak check at {} (epoch {}), not at its head {} (epoch {}): run                  `larch archive leak-check` again",
                c.position, c.epoch, m.head_position, m.epoch
            ),
            Some(_) => return Ok(()),
        };
        larch_core::failure::bail!(
            larch_core::failure::Reason::ArchiveNotTransformed,
            "source {id}: require_leak_check: the archive {key} (table {table}) {why}: refusing              to load its rows",
        );
    }

    /// Sends one diff's changes as events, streamed; `false` when the consumer went away.
    async fn send_diff(
        &self,
        diff: &Artifact,
        events: &mpsc::Sender<SourceEvent>,
    ) -> larch_archive::Result<bool> {
        let mut changes = self.reader.stream_diff(diff);
        while let Some(c) = changes.recv().await {
            let ev = change_event(&self.opts.table, &diff.to_position, c?);
            if events.send(SourceEvent::Change(ev)).await.is_err() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The plan a baseline serves: the head's, or the one of the point `at` pins (and what it
    /// resolved to).
    pub(super) fn plan_at(
        &self,
        m: &Manifest,
    ) -> Result<(Option<Plan>, Option<Resolution>), SourceError> {
        let Some(at) = &self.opts.at else {
            return Ok((plan(m, ""), None));
        };
        let r = resolve(m, at).map_err(|e| {
            SourceError::Other(
                anyhow::Error::new(e).context(format!("source {}: at {at}", self.opts.id)),
            )
        })?;
        if let Some(notice) = &r.notice {
            tracing::warn!(source = %self.opts.id, "{notice}");
        }
        tracing::info!(source = %self.opts.id, "serving the table at {at}: {}", r.describe());
        Ok((Some(r.plan.clone()), Some(r)))
    }

    /// Sends the rows `p` folds to (its snapshot and diff chain), streamed through the spill.
    pub(super) async fn send_head_rows(
        &self,
        p: Plan,
        key_fields: Vec<String>,
        rows: &mpsc::Sender<(TableId, Row)>,
    ) -> Result<(), SourceError> {
        let mut head = head_rows(
            self.reader.clone(),
            p,
            key_fields,
            self.spill.clone(),
            self.opts.spill.memory_limit,
        );
        while let Some(row) = head.rows.recv().await {
            rows.send((self.opts.table.clone(), row))
                .await
                .map_err(|_| SourceError::Stopped)?;
        }
        match head.verdict.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) if is_stopped(&e) => Err(SourceError::Stopped),
            Ok(Err(e)) => Err(SourceError::Other(
                anyhow::Error::new(e).context(format!("source {}: baseline", self.opts.id)),
            )),
            Err(_) => Err(SourceError::Other(anyhow::anyhow!(
                "source {}: baseline: the fold task vanished",
                self.opts.id
            ))),
        }
    }

    /// At the end of a chain that stops before the head: nothing more to read until repaired.
    pub(super) fn note_short_chain(&self, m: &Manifest, short: ShortChain) {
        let mut inner = self.inner.locked();
        if inner.short_chain.as_ref() != Some(&short) {
            tracing::warn!(source = %self.opts.id, "serving an older state than the archive's head: {short}");
        }
        inner.short_chain = Some(short);
        inner.epoch = newest_snapshot(m).map(|s| s.epoch);
        // Nothing more can be read until the chain is repaired.
        inner.behind = Behind::default();
    }

    pub(super) fn note_up_to_date(&self, m: &Manifest) {
        let mut inner = self.inner.locked();
        inner.short_chain = None;
        inner.epoch = newest_snapshot(m).map(|s| s.epoch);
        inner.behind = Behind::default();
    }

    /// Delivers `diffs` in order, each followed by its checkpoint, moving `from` along;
    /// `false` when the source was closed meanwhile.
    pub(super) async fn deliver_diffs(
        &self,
        m: &Manifest,
        diffs: &[Artifact],
        from: &mut String,
        events: &mpsc::Sender<SourceEvent>,
    ) -> Result<bool, SourceError> {
        self.inner.locked().behind = Behind::of(diffs);
        for (i, d) in diffs.iter().enumerate() {
            if self.closed() {
                return Ok(false);
            }
            let delivered = self
                .retry("reading a diff", || self.send_diff(d, events))
                .await?;
            if !delivered {
                return Err(SourceError::Stopped);
            }
            events
                .send(SourceEvent::Checkpoint {
                    position: d.to_position.clone(),
                })
                .await
                .map_err(|_| SourceError::Stopped)?;
            *from = d.to_position.clone();
            let mut inner = self.inner.locked();
            inner.position = Some(from.clone());
            inner.behind = Behind::of(&diffs[i + 1..]);
        }
        // On the newest snapshot's lineage now: that is our epoch.
        if let Some(snap) = newest_snapshot(m)
            && (same(&snap.to_position, from)
                || chain_from(m, &snap.to_position, None)
                    .iter()
                    .any(|d| same(&d.to_position, from)))
        {
            self.inner.locked().epoch = Some(snap.epoch);
        }
        Ok(true)
    }
}
