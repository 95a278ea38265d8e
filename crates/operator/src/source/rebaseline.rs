//! The re-baseline feed: samples of `laredo_source_rebaseline_total` per engine pod over time →
//! total, last time, "recent" and "per hour", which drive `Rebaselining` and `Degraded`.

use std::collections::{BTreeMap, VecDeque};

use jiff::{SignedDuration, Timestamp};

/// How long after an observed re-baseline `Rebaselining` stays True.
pub const RECENT_WINDOW: SignedDuration = SignedDuration::from_mins(5);
const HOUR: SignedDuration = SignedDuration::from_hours(1);

/// One engine pod's `laredo_source_rebaseline_total`, as one scrape read it.
#[derive(Debug, Clone, PartialEq)]
pub struct RebaselineSample {
    pub pod: String,
    pub total: f64,
    /// The pod was created after the previous scrape (its whole count is new).
    pub new_pod: bool,
}

/// Per-ArchiveSource memory of counter samples. Lives in the operator; `total` and `last_time`
/// are also persisted in status and restored from it after an operator restart.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RebaselineTracker {
    /// Last counter value per pod.
    last: BTreeMap<String, f64>,
    /// Observed increases in the last hour: (time, count).
    increases: VecDeque<(Timestamp, u64)>,
    pub total: i64,
    pub last_time: Option<Timestamp>,
    /// When the previous scrape was fed.
    pub last_scrape: Option<Timestamp>,
}

impl RebaselineTracker {
    /// A tracker resuming from persisted status.
    pub fn resume(total: i64, last_time: Option<Timestamp>) -> Self {
        Self {
            total,
            last_time,
            ..Default::default()
        }
    }

    /// Feeds one scrape: a sample for every pod that answered. Returns the number
    /// of re-baselines observed since the previous scrape. The first sample of a pod is a
    /// baseline, not an increase, unless the pod is new since the previous scrape (`new_pod`) — then
    /// its whole count is new.
    /// A counter that went down (the pod restarted) counts its new value as the increase.
    pub fn observe(&mut self, now: Timestamp, samples: &[RebaselineSample]) -> u64 {
        let mut increase = 0u64;
        let mut seen = BTreeMap::new();
        for sample in samples {
            let value = if sample.total.is_finite() && sample.total >= 0.0 {
                sample.total
            } else {
                continue;
            };
            let delta = match self.last.get(&sample.pod) {
                Some(prev) if value >= *prev => value - prev,
                Some(_) => value,
                None if sample.new_pod => value,
                None => 0.0,
            };
            increase += delta.round() as u64;
            seen.insert(sample.pod.clone(), value);
        }
        self.last = seen;
        self.last_scrape = Some(now);
        if increase > 0 {
            self.increases.push_back((now, increase));
            self.total += increase as i64;
            self.last_time = Some(now);
        }
        while let Some((t, _)) = self.increases.front() {
            if now.duration_since(*t) > HOUR {
                self.increases.pop_front();
            } else {
                break;
            }
        }
        increase
    }

    /// Whether a re-baseline was observed within [`RECENT_WINDOW`].
    pub fn recent(&self, now: Timestamp) -> bool {
        self.last_time
            .is_some_and(|t| now.duration_since(t) <= RECENT_WINDOW)
    }

    /// Re-baselines observed within the last hour (by this operator process).
    pub fn in_last_hour(&self, now: Timestamp) -> u64 {
        self.increases
            .iter()
            .filter(|(t, _)| now.duration_since(*t) <= HOUR)
            .map(|(_, n)| n)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(mins: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + mins * 60).unwrap()
    }

    fn s(pod: &str, v: f64) -> RebaselineSample {
        RebaselineSample {
            pod: pod.into(),
            total: v,
            new_pod: false,
        }
    }

    #[test]
    fn first_sample_is_a_baseline_then_increases_count() {
        let mut r = RebaselineTracker::default();
        assert_eq!(r.observe(t(0), &[s("a", 4.0), s("b", 1.0)]), 0);
        assert_eq!(r.total, 0);
        assert!(!r.recent(t(0)));
        assert_eq!(r.observe(t(1), &[s("a", 5.0), s("b", 1.0)]), 1);
        assert_eq!((r.total, r.last_time), (1, Some(t(1))));
        assert!(r.recent(t(1)));
        assert!(r.recent(t(6)));
        assert!(!r.recent(t(7)), "Rebaselining clears after the window");
    }

    #[test]
    fn counter_reset_and_new_pods() {
        let mut r = RebaselineTracker::default();
        r.observe(t(0), &[s("a", 10.0)]);
        // Pod a restarted: its counter starts over at 1 → one re-baseline.
        assert_eq!(r.observe(t(1), &[s("a", 1.0)]), 1);
        // A pod created since the last scrape: its whole count is new.
        assert_eq!(
            r.observe(
                t(2),
                &[
                    s("a", 1.0),
                    RebaselineSample {
                        pod: "b".into(),
                        total: 2.0,
                        new_pod: true
                    }
                ]
            ),
            2
        );
        assert_eq!(r.total, 3);
        // A pod that stops answering is forgotten; when it is back its value is a baseline.
        assert_eq!(r.observe(t(3), &[s("a", 1.0)]), 0);
        assert_eq!(r.observe(t(4), &[s("a", 1.0), s("b", 2.0)]), 0);
        // Garbage is ignored.
        assert_eq!(r.observe(t(5), &[s("a", f64::NAN), s("b", -1.0)]), 0);
    }

    #[test]
    fn per_hour_window_slides() {
        let mut r = RebaselineTracker::resume(7, Some(t(-30)));
        assert!(!r.recent(t(0)));
        r.observe(t(0), &[s("a", 0.0)]);
        for m in 1..=4 {
            r.observe(t(m * 10), &[s("a", m as f64)]);
        }
        assert_eq!(r.total, 11);
        assert_eq!(r.in_last_hour(t(40)), 4);
        assert_eq!(r.in_last_hour(t(65)), 4);
        assert_eq!(
            r.in_last_hour(t(75)),
            3,
            "the increase at minute 10 left the hour"
        );
        r.observe(t(125), &[s("a", 4.0)]);
        assert_eq!(r.in_last_hour(t(125)), 0);
        assert_eq!(r.total, 11, "the total never decreases");
    }
}
