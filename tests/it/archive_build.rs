//! Builds archives for engine and source tests through the `Store` trait: JSONL objects and a
//! manifest committed last, as a writer does. (Replace with `archive::writer` once it lands.)

use std::collections::BTreeMap;
use std::sync::Arc;

use larch::archive::format::{Encoder, Format};
use larch::archive::identity::laredo_row_key;
use larch::archive::manifest::{
    Artifact, ArtifactKind, FormatRef, Manifest, artifact_key, manifest_key, now_utc,
};
use larch::archive::model::{Action, Change, ColumnDefinition};
use larch::archive::store::Store;
use larch::archive::value::Row;

pub struct TestArchive {
    pub store: Arc<dyn Store>,
    pub prefix: String,
    pub manifest: Manifest,
    pub key_fields: Vec<String>,
}

/// `(action, old, new)` with rows as JSON text.
pub type Ch<'a> = (Action, Option<&'a str>, Option<&'a str>);

impl TestArchive {
    pub fn new(store: Arc<dyn Store>, prefix: &str, table: &str) -> TestArchive {
        let mut manifest = Manifest::new(table);
        manifest.epoch = 0;
        TestArchive {
            store,
            prefix: prefix.to_string(),
            manifest,
            key_fields: vec!["id".into()],
        }
    }

    #[allow(dead_code)] // used by the PostgreSQL-target tests
    pub fn with_columns(mut self, columns: Vec<ColumnDefinition>) -> Self {
        self.manifest.columns = columns;
        self
    }

    async fn put(&self, art: &mut Artifact, bytes: Vec<u8>) {
        let key = artifact_key(&self.prefix, art, Format::Jsonl.extension());
        let put = self.store.put(&key, &bytes).await.unwrap();
        art.formats.insert(
            "jsonl".into(),
            FormatRef {
                uri: put.uri,
                size_bytes: put.size as i64,
                sha256: Some(put.sha256),
            },
        );
    }

    /// Writes a snapshot of a new epoch (`epoch` = previous + 1) at `position` and commits.
    pub async fn snapshot(&mut self, position: &str, rows: &[&str]) {
        let epoch = self.manifest.epoch + 1;
        self.snapshot_in_epoch(epoch, position, rows).await;
    }

    pub async fn snapshot_in_epoch(&mut self, epoch: i64, position: &str, rows: &[&str]) {
        let mut enc = Encoder::new(Format::Jsonl).unwrap();
        for r in rows {
            enc.row(&Row::parse(r).unwrap()).unwrap();
        }
        let mut art = Artifact {
            kind: ArtifactKind::Snapshot,
            epoch,
            from_position: None,
            to_position: position.into(),
            created_at: now_utc(),
            row_count: rows.len() as i64,
            change_count: 0,
            formats: BTreeMap::new(),
            first_commit_time: None,
            last_commit_time: None,
            snapshot_time: None,
        };
        self.put(&mut art, enc.finish().unwrap()).await;
        self.manifest.epoch = epoch;
        self.manifest.head_position = position.into();
        self.manifest.artifacts.push(art);
        self.commit().await;
    }

    /// Writes a diff in the current epoch and commits.
    pub async fn diff(&mut self, from: &str, to: &str, changes: &[Ch<'_>]) {
        let mut enc = Encoder::new(Format::Jsonl).unwrap();
        for (action, old, new) in changes {
            let old = old.map(|r| Row::parse(r).unwrap());
            let new = new.map(|r| Row::parse(r).unwrap());
            let keyed = match action {
                Action::Delete => old.as_ref(),
                _ => new.as_ref(),
            };
            enc.change(&Change {
                action: *action,
                key: laredo_row_key(keyed, &self.key_fields),
                old,
                new,
            })
            .unwrap();
        }
        let mut art = Artifact {
            kind: ArtifactKind::Diff,
            epoch: self.manifest.epoch,
            from_position: Some(from.into()),
            to_position: to.into(),
            created_at: now_utc(),
            row_count: 0,
            change_count: changes.len() as i64,
            formats: BTreeMap::new(),
            first_commit_time: None,
            last_commit_time: None,
            snapshot_time: None,
        };
        self.put(&mut art, enc.finish().unwrap()).await;
        self.manifest.head_position = to.into();
        self.manifest.artifacts.push(art);
        self.commit().await;
    }

    /// Replaces the archive wholesale with a new epoch holding only a snapshot (an export over
    /// an existing archive, W6).
    pub async fn replace(&mut self, position: &str, rows: &[&str]) {
        self.manifest.artifacts.clear();
        self.snapshot(position, rows).await;
    }

    pub async fn commit(&mut self) {
        self.manifest.updated_at = now_utc();
        let key = manifest_key(&self.prefix);
        self.store
            .put(&key, &self.manifest.to_json())
            .await
            .unwrap();
    }
}

/// Columns `id int8` (the primary key) and `name text`.
pub fn id_name_columns() -> Vec<ColumnDefinition> {
    id_and_text_columns(&["id", "name"])
}

/// `names[0]` as `int8`, the primary key; the others nullable `text`.
pub fn id_and_text_columns(names: &[&str]) -> Vec<ColumnDefinition> {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| ColumnDefinition {
            name: n.to_string(),
            type_name: if i == 0 { "int8" } else { "text" }.into(),
            nullable: i != 0,
            primary_key: i == 0,
            primary_key_ordinal: if i == 0 { 1 } else { 0 },
            ordinal_position: i as i64 + 1,
            ..Default::default()
        })
        .collect()
}

/// Rows of the ids shaped `{"id":i,"v":"<tag>-i"}`.
pub fn rows(ids: impl IntoIterator<Item = i64>, tag: &str) -> Vec<String> {
    ids.into_iter()
        .map(|i| format!(r#"{{"id":{i},"v":"{tag}-{i}"}}"#))
        .collect()
}

pub fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}
