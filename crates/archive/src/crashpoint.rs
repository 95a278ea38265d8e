//! Crash points for the crash-safety tests, compiled in only with the cargo feature
//! `crashpoints` (`scripts/test.sh` builds the tests with it; release images do not, and there a
//! point is an empty function). `LARCH_CRASH_AT=<point>[@<n>]` makes the process
//! SIGKILL itself the n-th time (default: the first) it reaches `<point>`, so a test can kill
//! it exactly between two durable steps (a database commit and its state file, an upload and
//! its manifest). Unset, a point costs one relaxed atomic load. The points are the constants
//! below.
//!
//! Pause points hold a race window open instead: `LARCH_PAUSE_AT=<point>=<milliseconds>` makes
//! the first arrival at `<point>` wait that long.

/// Artifact objects stored, the manifest not yet swapped.
pub const WRITER_AFTER_UPLOAD: &str = "writer.after-upload";
/// The manifest swapped, pruned objects not yet deleted.
pub const WRITER_AFTER_COMMIT: &str = "writer.after-commit";
/// The targets committed a checkpoint, the source's state file not yet written.
pub const ENGINE_AFTER_CHECKPOINT: &str = "engine.after-checkpoint";
/// A run of buffered changes written to the spill directory.
pub const SPILL_AFTER_RUN: &str = "spill.after-run";
/// A split run's worker wrote a chunk of a range (S3: uploaded one of its parts).
pub const SPLIT_AFTER_PART: &str = "split.after-part";
/// A split run's worker stored a range and its checkpoint.
pub const SPLIT_AFTER_CHECKPOINT: &str = "split.after-checkpoint";
/// A split run's coordinator wrote its plan (the workers may start).
pub const SPLIT_AFTER_PLAN: &str = "split.after-plan";
/// Pause point: the slot's snapshot imported, the table not yet locked (a DDL may commit in
/// between).
pub const BASELINE_BEFORE_LOCK: &str = "baseline.before-lock";
/// Pause point: an export's baseline has copied 10 000 rows (its progress is read meanwhile).
pub const EXPORT_BASELINE_ROWS: &str = "export.baseline-rows";
/// Pause point: a restore has copied 10 000 rows of a table (its progress is read meanwhile).
pub const RESTORE_ROWS: &str = "restore.rows";

#[cfg(feature = "crashpoints")]
pub use armed::{crash_point, pause_point};

/// Without the feature: nothing.
#[cfg(not(feature = "crashpoints"))]
#[inline(always)]
pub fn crash_point(_point: &str) {}

/// Without the feature: nothing.
#[cfg(not(feature = "crashpoints"))]
#[inline(always)]
pub async fn pause_point(_point: &str) {}

#[cfg(feature = "crashpoints")]
mod armed {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    struct Armed {
        point: String,
        nth: u64,
        hits: AtomicU64,
    }

    fn armed() -> Option<&'static Armed> {
        static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
        ARMED
            .get_or_init(|| {
                let spec = std::env::var("LARCH_CRASH_AT").ok()?;
                let (point, nth) = match spec.split_once('@') {
                    Some((p, n)) => (p.to_string(), n.parse().unwrap_or(1)),
                    None => (spec, 1),
                };
                Some(Armed {
                    point,
                    nth: nth.max(1),
                    hits: AtomicU64::new(0),
                })
            })
            .as_ref()
    }

    /// Kills the process with SIGKILL when `point` is the armed crash point and this is its n-th hit.
    pub fn crash_point(point: &str) {
        let Some(a) = armed() else { return };
        if a.point != point {
            return;
        }
        if a.hits.fetch_add(1, Ordering::Relaxed) + 1 == a.nth {
            eprintln!(
                "LARCH_CRASH_AT: killing this process at {point} (hit {})",
                a.nth
            );
            // SIGKILL, not abort or exit: no destructor, flush or signal handler may run.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
    }

    /// Waits at `point` when `LARCH_PAUSE_AT` names it (the first time only).
    pub async fn pause_point(point: &str) {
        static ARMED: OnceLock<Option<(String, u64, AtomicU64)>> = OnceLock::new();
        let armed = ARMED.get_or_init(|| {
            let spec = std::env::var("LARCH_PAUSE_AT").ok()?;
            let (point, ms) = spec.split_once('=')?;
            Some((point.to_string(), ms.parse().ok()?, AtomicU64::new(0)))
        });
        let Some((armed_point, ms, hits)) = armed else {
            return;
        };
        if armed_point == point && hits.fetch_add(1, Ordering::Relaxed) == 0 {
            // Around a progress bar's frames, not through one.
            larch_core::progress::suspend_bars(|| {
                eprintln!("LARCH_PAUSE_AT: pausing {ms} ms at {point}")
            });
            tokio::time::sleep(std::time::Duration::from_millis(*ms)).await;
        }
    }
}
