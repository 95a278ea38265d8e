//! `archive verify`: every object exists, sizes and checksums match, records decode and their
//! counts match the manifest, every chain link is valid.

use std::cmp::Ordering;

use super::error::Result;
use super::format::Format;
use super::manifest::{Artifact, ArtifactKind, Manifest, artifact_key};
use super::plan::{broken_link_reason, newest_snapshot, plan_head};
use super::position::{canonical, compare};
use super::reader::ArchiveReader;

#[derive(Debug, Default)]
pub struct Report {
    pub checked_objects: usize,
    pub problems: Vec<String>,
}

pub async fn verify(reader: &ArchiveReader) -> Result<(Manifest, Report)> {
    let manifest = reader.load_manifest().await?;
    let mut report = Report::default();
    for artifact in &manifest.artifacts {
        check_links(&manifest, artifact, &mut report);
        for (format_id, fref) in &artifact.formats {
            let Ok(format) = Format::parse(format_id) else {
                report.problems.push(format!(
                    "{}: unknown format {format_id:?}",
                    describe(artifact)
                ));
                continue;
            };
            let key = artifact_key(reader.key_prefix(), artifact, format.extension());
            check_records(reader, artifact, format, &key, &mut report).await?;
            if fref.size_bytes < 0 {
                report
                    .problems
                    .push(format!("{key}: negative size_bytes {}", fref.size_bytes));
            }
        }
        if artifact.formats.is_empty() {
            report
                .problems
                .push(format!("{}: lists no formats", describe(artifact)));
        }
    }
    check_head(&manifest, &mut report);
    Ok((manifest, report))
}

/// Reads one object of `artifact` to the end: it decodes and holds as many records as the
/// manifest says.
async fn check_records(
    reader: &ArchiveReader,
    artifact: &Artifact,
    format: Format,
    key: &str,
    report: &mut Report,
) -> Result<()> {
    let single = ArchiveReader::new(reader.store().clone(), reader.key_prefix(), vec![format])?;
    report.checked_objects += 1;
    let counted = match artifact.kind {
        ArtifactKind::Snapshot => {
            return_boxed(single.fold_rows(artifact, vec!["id".into()], 0i64, |n, _| {
                *n += 1;
                Ok(())
            }))
        }
        ArtifactKind::Diff => {
            // Boxed to unify the two future types.
            return_boxed(single.fold_changes(artifact, 0i64, |n, _| {
                *n += 1;
                Ok(())
            }))
        }
    }
    .await;
    match counted {
        // Most read errors name the object already: never twice.
        Err(e) => {
            let e = e.to_string();
            report.problems.push(if e.contains(key) {
                e
            } else {
                format!("{key}: {e}")
            })
        }
        Ok(n) => {
            let want = match artifact.kind {
                ArtifactKind::Snapshot => artifact.row_count,
                ArtifactKind::Diff => artifact.change_count,
            };
            if n != want {
                let what = if artifact.kind == ArtifactKind::Snapshot {
                    "row_count"
                } else {
                    "change_count"
                };
                report.problems.push(format!(
                    "{key}: holds {n} records, the manifest's {what} says {want}"
                ));
            }
        }
    }
    Ok(())
}

/// The chain from the newest snapshot reaches the manifest's head.
fn check_head(manifest: &Manifest, report: &mut Report) {
    if let Some(snapshot) = newest_snapshot(manifest) {
        let plan = plan_head(manifest);
        if compare(&plan.head_position, &manifest.head_position) != Ordering::Equal
            && canonical(&plan.head_position) != canonical(&manifest.head_position)
        {
            report.problems.push(format!(
                "the chain from the newest snapshot (epoch {}, {}) reaches {:?}, not the manifest head {:?}",
                snapshot.epoch, snapshot.to_position, plan.head_position, manifest.head_position
            ));
        }
    } else if manifest
        .artifacts
        .iter()
        .any(|a| a.kind == ArtifactKind::Diff)
    {
        report
            .problems
            .push("the manifest lists diffs but no snapshot to start from".into());
    }
}

fn return_boxed<'a, T>(
    f: impl std::future::Future<Output = Result<T>> + Send + 'a,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<T>> + Send + 'a>> {
    Box::pin(f)
}

fn describe(a: &Artifact) -> String {
    match a.kind {
        ArtifactKind::Snapshot => format!("snapshot epoch {} at {:?}", a.epoch, a.to_position),
        ArtifactKind::Diff => format!(
            "diff epoch {} {:?} -> {:?}",
            a.epoch,
            a.from_position.as_deref().unwrap_or(""),
            a.to_position
        ),
    }
}

fn check_links(manifest: &Manifest, artifact: &Artifact, report: &mut Report) {
    if artifact.kind != ArtifactKind::Diff {
        return;
    }
    if let Some(reason) = broken_link_reason(artifact) {
        report
            .problems
            .push(format!("{}: broken link: {reason}", describe(artifact)));
        return;
    }
    let from = canonical(artifact.from_position.as_deref().unwrap_or(""));
    let linked = manifest.artifacts.iter().any(|o| {
        !std::ptr::eq(o, artifact) && canonical(&o.to_position) == from && o.epoch == artifact.epoch
    });
    if !linked {
        report.problems.push(format!(
            "{}: no artifact of its epoch ends at its from_position",
            describe(artifact)
        ));
    }
}
