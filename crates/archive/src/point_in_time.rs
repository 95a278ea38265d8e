//! Points in time: a position or a commit time, resolved against a manifest into the plan that
//! reads the table as it was then (every `--at`, the engine's `at`, ArchiveSource `spec.at`).
//!
//! ```no_run
//! # async fn f(reader: larch::archive::reader::ArchiveReader) -> anyhow::Result<()> {
//! use larch::archive::point_in_time::{PointInTime, resolve};
//! let at: PointInTime = "2026-11-30T14:00:00Z".parse().map_err(anyhow::Error::msg)?;
//! let manifest = reader.load_manifest().await?;
//! let resolution = resolve(&manifest, &at)?;
//! if let Some(notice) = &resolution.notice {
//!     eprintln!("notice: {notice}");
//! }
//! let state = reader.reconstruct(&resolution.plan, &["id".to_string()]).await?;
//! # Ok(()) }
//! ```

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, FixedOffset};
use serde::Serialize;

use super::error::{ArchiveError, Result};
use super::manifest::{Artifact, Manifest, format_time};
use super::plan::{Plan, chain_from, plan_as_of, plan_head};
use super::position::{Lsn, compare, same};

/// Where to read an archive: after a position, or after the last transaction committed at or
/// before a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PointInTime {
    Position(Lsn),
    Time(DateTime<FixedOffset>),
}

impl FromStr for PointInTime {
    type Err = String;

    /// An LSN (`16/B374D848`) or an RFC 3339 time (`2026-11-30T14:00:00Z`).
    fn from_str(text: &str) -> std::result::Result<PointInTime, String> {
        let text = text.trim();
        if let Some(lsn) = Lsn::parse(text) {
            return Ok(PointInTime::Position(lsn));
        }
        DateTime::parse_from_rfc3339(text)
            .map(PointInTime::Time)
            .map_err(|e| {
                format!(
                    "{text:?} is neither a position (an LSN such as 16/B374D848) nor an RFC 3339 \
                     time such as 2026-11-30T14:00:00Z ({e})"
                )
            })
    }
}

impl PointInTime {
    /// The point as it is written: `16/B374D848` or `2026-11-30T14:00:00Z`.
    pub fn value(&self) -> String {
        match self {
            PointInTime::Position(lsn) => lsn.to_string(),
            PointInTime::Time(t) => format_time(t),
        }
    }
}

impl fmt::Display for PointInTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PointInTime::Position(lsn) => write!(f, "position {lsn}"),
            PointInTime::Time(t) => write!(f, "time {}", format_time(t)),
        }
    }
}

/// How close the state read is to the point asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Exactly the state after the last transaction at or before the point.
    Transaction,
    /// The state at the end of the last diff that ends at or before the point: transactions
    /// of the next diff that are before the point too are not in it (a diff is the smallest
    /// unit that can be read, since it collapses changes per row).
    Diff,
}

impl Precision {
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Transaction => "transaction",
            Precision::Diff => "diff",
        }
    }
}

/// A point resolved against a manifest: what to read, and the point it reaches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolution {
    /// Read this (with [`super::reader::ArchiveReader::reconstruct`]).
    pub plan: Plan,
    /// The position of the state read.
    pub position: String,
    /// The commit time of the state read, when the archive records it.
    pub time: Option<DateTime<FixedOffset>>,
    pub precision: Precision,
    /// Set when the point is past the archive's head (the head is read).
    pub notice: Option<String>,
}

impl Resolution {
    /// `position 0/1A2B (time 2026-11-30T13:59:58Z, exact to the transaction)`.
    pub fn describe(&self) -> String {
        let time = self
            .time
            .map(|t| format!("time {}, ", format_time(&t)))
            .unwrap_or_default();
        let precision = match self.precision {
            Precision::Transaction => "exact to the transaction",
            Precision::Diff => "to the diff",
        };
        format!("position {} ({time}{precision})", self.position)
    }
}

/// The time an artifact's state is known to be at or after: its recorded commit time, else
/// (archives laredo or an older larch wrote) its `created_at`, which is never earlier.
fn bound(a: &Artifact) -> DateTime<FixedOffset> {
    a.end_time().unwrap_or(a.created_at)
}

/// The range of points an archive can be read at (CloudNativePG's "first recoverability
/// point" to its head).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Window {
    pub earliest_position: String,
    #[serde(serialize_with = "opt_time", skip_serializing_if = "Option::is_none")]
    pub earliest_time: Option<DateTime<FixedOffset>>,
    pub latest_position: String,
    #[serde(serialize_with = "opt_time", skip_serializing_if = "Option::is_none")]
    pub latest_time: Option<DateTime<FixedOffset>>,
}

fn opt_time<S: serde::Serializer>(
    t: &Option<DateTime<FixedOffset>>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_str(&format_time(t)),
        None => s.serialize_none(),
    }
}

/// The oldest snapshot (lowest position): the earliest point that can be read.
fn earliest(manifest: &Manifest) -> Option<&Artifact> {
    manifest
        .snapshots()
        .min_by(|a, b| compare(&a.to_position, &b.to_position))
}

/// The restorable window: the oldest snapshot to the head the newest snapshot's chain
/// reaches. `None` without a snapshot. Times are the recorded commit times (absent in
/// archives without them).
pub fn window(manifest: &Manifest) -> Option<Window> {
    let first = earliest(manifest)?;
    let head = plan_head(manifest);
    let last = head.diffs.last().or(head.snapshot.as_ref())?;
    Some(Window {
        earliest_position: first.to_position.clone(),
        earliest_time: first.end_time(),
        latest_position: head.head_position.clone(),
        latest_time: last.end_time(),
    })
}

fn earliest_point(manifest: &Manifest) -> String {
    match earliest(manifest) {
        None => "none: the archive has no snapshot".into(),
        Some(s) => match s.end_time() {
            Some(t) => format!("position {} at {}", s.to_position, format_time(&t)),
            None => format!(
                "position {} (no commit time recorded; created {})",
                s.to_position,
                format_time(&s.created_at)
            ),
        },
    }
}

/// Resolves `at` against `manifest`: the plan that reads the state after the last transaction
/// at or before it. Before the archive's earliest point: an error naming that point. After the
/// head: the head, with a notice.
pub fn resolve(manifest: &Manifest, at: &PointInTime) -> Result<Resolution> {
    match at {
        PointInTime::Position(lsn) => resolve_position(manifest, &lsn.to_string()),
        PointInTime::Time(t) => resolve_time(manifest, *t),
    }
}

fn resolve_position(manifest: &Manifest, at: &str) -> Result<Resolution> {
    let plan = plan_as_of(manifest, at).map_err(|e| match e {
        ArchiveError::Predates { position, .. } => ArchiveError::Invalid(format!(
            "position {position} predates the archive: its earliest point is {}",
            earliest_point(manifest)
        )),
        e => e,
    })?;
    let reached = plan.diffs.last().or(plan.snapshot.as_ref()).cloned();
    let next = chain_from(manifest, &plan.head_position, None)
        .first()
        .map(|d| (*d).clone());
    let (precision, notice) = match &next {
        _ if same(&plan.head_position, at) => (Precision::Transaction, None),
        // The next diff ends after `at`: what it holds up to `at` is not read.
        Some(_) => (Precision::Diff, None),
        None => (
            Precision::Transaction,
            (compare(at, &plan.head_position) == Ordering::Greater).then(|| {
                format!(
                    "position {at} is past the archive's head {}: reading the head",
                    plan.head_position
                )
            }),
        ),
    };
    Ok(Resolution {
        position: plan.head_position.clone(),
        time: reached.as_ref().and_then(Artifact::end_time),
        plan,
        precision,
        notice,
    })
}

fn resolve_time(manifest: &Manifest, at: DateTime<FixedOffset>) -> Result<Resolution> {
    // The base: among snapshots whose state is at or before `at`, the one furthest along.
    let mut base: Option<&Artifact> = None;
    for s in manifest.snapshots() {
        if bound(s) <= at
            && base.is_none_or(|b| compare(&s.to_position, &b.to_position) == Ordering::Greater)
        {
            base = Some(s);
        }
    }
    let Some(base) = base else {
        return Err(ArchiveError::Invalid(format!(
            "time {} predates the archive: its earliest point is {}",
            format_time(&at),
            earliest_point(manifest)
        )));
    };
    let chain = chain_from(manifest, &base.to_position, None);
    let taken = chain.iter().take_while(|d| bound(d) <= at).count();
    let reached: &Artifact = if taken == 0 { base } else { chain[taken - 1] };
    let next = chain.get(taken);
    let precision = match next {
        // The next diff's first transaction is after `at`: nothing between is missing.
        Some(d) if d.first_commit_time.is_some_and(|first| first > at) => Precision::Transaction,
        Some(_) => Precision::Diff,
        None if reached.end_time().is_some() => Precision::Transaction,
        None => Precision::Diff,
    };
    let notice = next.is_none().then(|| {
        format!(
            "time {} is at or after the archive's head (position {}{}): reading the head",
            format_time(&at),
            reached.to_position,
            reached
                .end_time()
                .map(|t| format!(", last commit {}", format_time(&t)))
                .unwrap_or_default()
        )
    });
    let plan = Plan {
        snapshot: Some(base.clone()),
        diffs: chain[..taken].iter().map(|d| (*d).clone()).collect(),
        head_position: reached.to_position.clone(),
    };
    Ok(Resolution {
        position: plan.head_position.clone(),
        time: reached.end_time(),
        plan,
        precision,
        notice,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{art, manifest};
    use crate::manifest::ArtifactKind;

    fn t(s: &str) -> DateTime<FixedOffset> {
        DateTime::parse_from_rfc3339(&format!("2026-11-30T{s}Z")).unwrap()
    }

    fn at(s: &str) -> PointInTime {
        s.parse().unwrap()
    }

    /// Snapshot at 0/10 taken 14:00:00; diffs with commits 14:00:10–14:00:20 (to 0/20) and
    /// 14:00:30–14:00:40 (to 0/30).
    fn timed() -> Manifest {
        let snapshot = Artifact {
            snapshot_time: Some(t("14:00:00")),
            ..art(ArtifactKind::Snapshot, 1, None, "0/10")
        };
        let diff = |from: &str, to: &str, first: &str, last: &str| Artifact {
            first_commit_time: Some(t(first)),
            last_commit_time: Some(t(last)),
            ..art(ArtifactKind::Diff, 1, Some(from), to)
        };
        manifest(
            vec![
                snapshot,
                diff("0/10", "0/20", "14:00:10", "14:00:20"),
                diff("0/20", "0/30", "14:00:30", "14:00:40"),
            ],
            "0/30",
        )
    }

    #[test]
    fn parses_positions_and_rfc3339_times() {
        assert_eq!(
            at("16/B374D848"),
            PointInTime::Position(Lsn(0x16_B374_D848))
        );
        assert_eq!(at(" 0/10 "), PointInTime::Position(Lsn(0x10)));
        assert_eq!(at("2026-11-30T14:00:00Z"), PointInTime::Time(t("14:00:00")));
        assert_eq!(
            at("2026-11-30T15:00:00.5+01:00"),
            PointInTime::Time(t("14:00:00.5"))
        );
        let e = "yesterday".parse::<PointInTime>().unwrap_err();
        assert!(e.contains("\"yesterday\" is neither a position"), "{e}");
        assert!(e.contains("RFC 3339"), "{e}");
        // A date alone is not RFC 3339: refused, not guessed.
        assert!("2026-11-30".parse::<PointInTime>().is_err());
        assert_eq!(at("0/1A").to_string(), "position 0/0000001A");
        assert_eq!(
            at("2026-11-30T14:00:00Z").to_string(),
            "time 2026-11-30T14:00:00Z"
        );
    }

    #[test]
    fn time_between_diffs_is_exact_to_the_transaction() {
        let r = resolve(&timed(), &at("2026-11-30T14:00:25Z")).unwrap();
        assert_eq!(r.position, "0/20");
        assert_eq!(r.plan.diffs.len(), 1);
        assert_eq!(r.time, Some(t("14:00:20")));
        assert_eq!(r.precision, Precision::Transaction);
        assert_eq!(r.notice, None);
        assert!(
            r.describe().contains("exact to the transaction"),
            "{}",
            r.describe()
        );
    }

    #[test]
    fn exact_commit_time_includes_that_transaction() {
        let r = resolve(&timed(), &at("2026-11-30T14:00:20Z")).unwrap();
        assert_eq!((r.position.as_str(), r.plan.diffs.len()), ("0/20", 1));
        let r = resolve(&timed(), &at("2026-11-30T14:00:00Z")).unwrap();
        assert_eq!((r.position.as_str(), r.plan.diffs.len()), ("0/10", 0));
        assert_eq!(r.time, Some(t("14:00:00")));
        assert_eq!(r.precision, Precision::Transaction);
    }

    #[test]
    fn time_inside_a_diff_reads_to_the_diff_before_it() {
        let r = resolve(&timed(), &at("2026-11-30T14:00:15Z")).unwrap();
        assert_eq!((r.position.as_str(), r.plan.diffs.len()), ("0/10", 0));
        assert_eq!(r.precision, Precision::Diff);
        assert!(r.describe().contains("to the diff"), "{}", r.describe());
    }

    #[test]
    fn before_the_start_names_the_earliest_point() {
        let e = resolve(&timed(), &at("2026-11-30T13:59:59Z"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("time 2026-11-30T13:59:59Z predates the archive")
                && e.contains("earliest point is position 0/10 at 2026-11-30T14:00:00Z"),
            "{e}"
        );
        let e = resolve(&timed(), &at("0/5")).unwrap_err().to_string();
        assert!(
            e.contains("position 0/00000005 predates the archive")
                && e.contains("position 0/10 at 2026-11-30T14:00:00Z"),
            "{e}"
        );
    }

    #[test]
    fn after_the_head_reads_the_head_with_a_notice() {
        let r = resolve(&timed(), &at("2026-12-01T00:00:00Z")).unwrap();
        assert_eq!((r.position.as_str(), r.plan.diffs.len()), ("0/30", 2));
        assert_eq!(r.time, Some(t("14:00:40")));
        let n = r.notice.unwrap();
        assert!(
            n.contains(
                "after the archive's head (position 0/30, last commit 2026-11-30T14:00:40Z)"
            ),
            "{n}"
        );
        let r = resolve(&timed(), &at("1/0")).unwrap();
        assert_eq!(r.position, "0/30");
        assert!(r.notice.unwrap().contains("past the archive's head 0/30"));
    }

    #[test]
    fn positions_report_their_precision_and_time() {
        let r = resolve(&timed(), &at("0/20")).unwrap();
        assert_eq!(r.precision, Precision::Transaction);
        assert_eq!(r.time, Some(t("14:00:20")));
        let r = resolve(&timed(), &at("0/25")).unwrap();
        assert_eq!(
            (r.position.as_str(), r.precision),
            ("0/20", Precision::Diff)
        );
        assert_eq!(r.notice, None);
        let r = resolve(&timed(), &at("0/30")).unwrap();
        assert_eq!((r.precision, r.notice), (Precision::Transaction, None));
    }

    #[test]
    fn archives_without_commit_times_resolve_by_creation_time() {
        // laredo's archives: no commit times, only created_at (never before the state).
        let created = |a: Artifact, at: &str| Artifact {
            created_at: t(at),
            ..a
        };
        let m = manifest(
            vec![
                created(art(ArtifactKind::Snapshot, 1, None, "0/10"), "14:00:00"),
                created(art(ArtifactKind::Diff, 1, Some("0/10"), "0/20"), "14:01:00"),
                created(art(ArtifactKind::Diff, 1, Some("0/20"), "0/30"), "14:02:00"),
            ],
            "0/30",
        );
        let r = resolve(&m, &at("2026-11-30T14:01:30Z")).unwrap();
        assert_eq!((r.position.as_str(), r.plan.diffs.len()), ("0/20", 1));
        assert_eq!((r.time, r.precision), (None, Precision::Diff));
        let e = resolve(&m, &at("2026-11-30T13:00:00Z"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("position 0/10 (no commit time recorded; created 2026-11-30T14:00:00Z)"),
            "{e}"
        );
        let w = window(&m).unwrap();
        assert_eq!((w.earliest_time, w.latest_time), (None, None));
        assert_eq!(w.latest_position, "0/30");
    }

    #[test]
    fn the_window_spans_the_oldest_snapshot_to_the_head() {
        let mut m = timed();
        m.artifacts.push(Artifact {
            snapshot_time: Some(t("14:00:40")),
            ..art(ArtifactKind::Snapshot, 2, None, "0/30")
        });
        m.artifacts.push(Artifact {
            first_commit_time: Some(t("14:00:50")),
            last_commit_time: Some(t("14:00:55")),
            ..art(ArtifactKind::Diff, 2, Some("0/30"), "0/40")
        });
        m.head_position = "0/40".into();
        let w = window(&m).unwrap();
        assert_eq!(
            (w.earliest_position.as_str(), w.earliest_time),
            ("0/10", Some(t("14:00:00")))
        );
        assert_eq!(
            (w.latest_position.as_str(), w.latest_time),
            ("0/40", Some(t("14:00:55")))
        );
        // Inside epoch 1 still resolves from its own snapshot.
        let r = resolve(&m, &at("2026-11-30T14:00:25Z")).unwrap();
        assert_eq!(r.plan.snapshot.unwrap().epoch, 1);
        assert!(window(&manifest(vec![], "")).is_none());
    }

    #[test]
    fn commit_times_serialise_only_when_known() {
        let plain = serde_json::to_value(art(ArtifactKind::Diff, 1, Some("0/1"), "0/2")).unwrap();
        assert!(plain.get("first_commit_time").is_none());
        let d = timed().artifacts[1].clone();
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["first_commit_time"], "2026-11-30T14:00:10Z");
        assert_eq!(v["last_commit_time"], "2026-11-30T14:00:20Z");
        let back: Artifact = serde_json::from_value(v).unwrap();
        assert_eq!(back, d);
    }
}
