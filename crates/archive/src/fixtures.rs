//! Builders of manifests and artifacts for unit tests (one place; `tests/it/archive_build.rs`
//! writes real archives through a store for the integration tests).

use super::manifest::{Artifact, ArtifactKind, Manifest, now_utc};

/// An artifact with no formats and no counts, created now.
pub fn art(kind: ArtifactKind, epoch: i64, from: Option<&str>, to: &str) -> Artifact {
    Artifact {
        kind,
        epoch,
        from_position: from.map(str::to_string),
        to_position: to.to_string(),
        created_at: now_utc(),
        row_count: 0,
        change_count: 0,
        formats: Default::default(),
        first_commit_time: None,
        last_commit_time: None,
        snapshot_time: None,
    }
}

/// A manifest of `public.t` holding `arts` at head `head`, in the newest artifact's epoch.
pub fn manifest(arts: Vec<Artifact>, head: &str) -> Manifest {
    let mut m = Manifest::new("public.t");
    m.epoch = arts.iter().map(|a| a.epoch).max().unwrap_or(0);
    m.artifacts = arts;
    m.head_position = head.into();
    m
}
