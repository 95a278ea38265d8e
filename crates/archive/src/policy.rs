//! The new-epoch policy (laredo's "re-base" policy, spec §6.7): when the writer starts a new
//! epoch (a snapshot) instead of writing another diff. Not a re-baseline, which is a consumer
//! reloading its table.

use std::time::Duration;

#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    /// How often buffered changes are flushed (required, > 0).
    pub diff_interval: Duration,
    /// Never snapshot sooner than this after the last snapshot (beats every trigger).
    pub min_interval: Duration,
    pub max_interval: Duration,
    pub max_diff_bytes: u64,
    pub max_diff_fraction: f64,
    pub max_churn_records: u64,
    pub max_churn_fraction: f64,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            diff_interval: Duration::from_secs(30),
            min_interval: Duration::ZERO,
            max_interval: Duration::ZERO,
            max_diff_bytes: 0,
            max_diff_fraction: 0.0,
            max_churn_records: 0,
            max_churn_fraction: 0.0,
        }
    }
}

/// The policy trigger that starts a new epoch; `as_str` is laredo's name (metric labels, logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpochTrigger {
    MaxInterval,
    MaxDiffBytes,
    MaxDiffFraction,
    MaxChurnRecords,
    MaxChurnFraction,
}

impl EpochTrigger {
    pub fn as_str(self) -> &'static str {
        match self {
            EpochTrigger::MaxInterval => "max_interval",
            EpochTrigger::MaxDiffBytes => "max_diff_bytes",
            EpochTrigger::MaxDiffFraction => "max_diff_fraction",
            EpochTrigger::MaxChurnRecords => "max_churn_records",
            EpochTrigger::MaxChurnFraction => "max_churn_fraction",
        }
    }
}

impl std::fmt::Display for EpochTrigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the policy looks at.
#[derive(Clone, Debug, Default)]
pub struct PolicyInputs {
    pub since_snapshot: Duration,
    pub diff_bytes: u64,
    pub last_snapshot_bytes: u64,
    pub churn: u64,
    pub row_count: u64,
}

impl Policy {
    pub fn validate(&self) -> Result<(), String> {
        if self.diff_interval.is_zero() {
            return Err("diff interval must be greater than zero".into());
        }
        for (name, f) in [
            ("max diff fraction", self.max_diff_fraction),
            ("max churn fraction", self.max_churn_fraction),
        ] {
            if !(f.is_finite() && f >= 0.0) {
                return Err(format!("{name} must be a non-negative number, got {f}"));
            }
        }
        Ok(())
    }

    /// The first trigger that fires (laredo's order), or `None` for a diff.
    pub fn evaluate(&self, i: &PolicyInputs) -> Option<EpochTrigger> {
        if !self.min_interval.is_zero() && i.since_snapshot < self.min_interval {
            return None;
        }
        if !self.max_interval.is_zero() && i.since_snapshot >= self.max_interval {
            return Some(EpochTrigger::MaxInterval);
        }
        if self.max_diff_bytes > 0 && i.diff_bytes >= self.max_diff_bytes {
            return Some(EpochTrigger::MaxDiffBytes);
        }
        if self.max_diff_fraction > 0.0
            && i.last_snapshot_bytes > 0
            && i.diff_bytes as f64 >= self.max_diff_fraction * i.last_snapshot_bytes as f64
        {
            return Some(EpochTrigger::MaxDiffFraction);
        }
        if self.max_churn_records > 0 && i.churn >= self.max_churn_records {
            return Some(EpochTrigger::MaxChurnRecords);
        }
        if self.max_churn_fraction > 0.0
            && i.row_count > 0
            && i.churn as f64 >= self.max_churn_fraction * i.row_count as f64
        {
            return Some(EpochTrigger::MaxChurnFraction);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> PolicyInputs {
        PolicyInputs {
            since_snapshot: Duration::from_secs(100),
            diff_bytes: 1000,
            last_snapshot_bytes: 2000,
            churn: 50,
            row_count: 100,
        }
    }

    #[test]
    fn each_trigger_fires_and_names_itself() {
        let base = Policy {
            diff_interval: Duration::from_secs(1),
            ..Default::default()
        };
        assert_eq!(
            base.evaluate(&inputs()),
            None,
            "an all-zero policy never starts a new epoch"
        );
        let p = Policy {
            max_interval: Duration::from_secs(60),
            ..base.clone()
        };
        assert_eq!(p.evaluate(&inputs()), Some(EpochTrigger::MaxInterval));
        let p = Policy {
            max_diff_bytes: 1000,
            ..base.clone()
        };
        assert_eq!(p.evaluate(&inputs()), Some(EpochTrigger::MaxDiffBytes));
        let p = Policy {
            max_diff_fraction: 0.5,
            ..base.clone()
        };
        assert_eq!(p.evaluate(&inputs()), Some(EpochTrigger::MaxDiffFraction));
        let p = Policy {
            max_churn_records: 50,
            ..base.clone()
        };
        assert_eq!(p.evaluate(&inputs()), Some(EpochTrigger::MaxChurnRecords));
        let p = Policy {
            max_churn_fraction: 0.5,
            ..base.clone()
        };
        assert_eq!(p.evaluate(&inputs()), Some(EpochTrigger::MaxChurnFraction));
        let p = Policy {
            max_churn_fraction: 0.6,
            ..base.clone()
        };
        assert_eq!(p.evaluate(&inputs()), None);
    }

    #[test]
    fn min_interval_beats_every_trigger() {
        let p = Policy {
            diff_interval: Duration::from_secs(1),
            min_interval: Duration::from_secs(200),
            max_interval: Duration::from_secs(1),
            max_diff_bytes: 1,
            max_diff_fraction: 0.01,
            max_churn_records: 1,
            max_churn_fraction: 0.01,
        };
        assert_eq!(p.evaluate(&inputs()), None);
    }

    #[test]
    fn validation() {
        assert!(
            Policy {
                diff_interval: Duration::ZERO,
                ..Default::default()
            }
            .validate()
            .is_err()
        );
        assert!(
            Policy {
                max_diff_fraction: f64::NAN,
                ..Default::default()
            }
            .validate()
            .is_err()
        );
        assert!(Policy::default().validate().is_ok());
    }
}
