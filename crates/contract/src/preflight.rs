//! What an export pod reports of its constraint preflight: the `preflight` of a one-shot
//! export's summary (its termination message) and of a continuous writer's `/status`. The
//! operator reads it into the ArchiveExport's `Validated` condition. Names only: constraint,
//! table and column names and the rules' names, never a row's value.

use serde::{Deserialize, Serialize};

/// Constraints listed at most (the rest are counted): a termination message keeps 4 KiB.
pub const LISTED: usize = 5;

/// A listed constraint's text is cut to this many characters.
pub const LINE_CHARS: usize = 240;

/// The preflight of an export with a transform, as its pod reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreflightSummary {
    /// Constraints looked at (NOT NULL columns counted one each).
    #[serde(default)]
    pub constraints_checked: usize,
    /// Constraints the transform can break, in all.
    #[serde(default)]
    pub at_risk: usize,
    /// The first [`LISTED`] of them, each `table.constraint (KIND): why`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// Why the preflight could not run (then it found nothing; the export went on unless it
    /// required the preflight).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl PreflightSummary {
    /// The summary of `lines` (every constraint at risk, as `table.constraint (KIND): why`).
    pub fn of(constraints_checked: usize, lines: Vec<String>) -> PreflightSummary {
        PreflightSummary {
            constraints_checked,
            at_risk: lines.len(),
            problems: lines
                .into_iter()
                .take(LISTED)
                .map(|l| cut(&l, LINE_CHARS))
                .collect(),
            error: None,
        }
    }

    /// The preflight could not run: `why`.
    pub fn failed(why: &str) -> PreflightSummary {
        PreflightSummary {
            error: Some(cut(why, 4 * LINE_CHARS)),
            ..Default::default()
        }
    }

    /// The listed constraints joined by `; `, with `and K more` for the unlisted ones.
    pub fn listed(&self) -> String {
        let mut out = self.problems.join("; ");
        if self.at_risk > self.problems.len() {
            out.push_str(&format!(
                "; and {} more",
                self.at_risk - self.problems.len()
            ));
        }
        out
    }
}

/// `s` cut to `max` characters, marked when cut.
fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_the_first_and_counts_the_rest() {
        let lines: Vec<String> = (0..7)
            .map(|i| format!("public.t.c{i} (UNIQUE): x"))
            .collect();
        let s = PreflightSummary::of(12, lines);
        assert_eq!((s.constraints_checked, s.at_risk), (12, 7));
        assert_eq!(s.problems.len(), LISTED);
        assert!(s.listed().ends_with("public.t.c4 (UNIQUE): x; and 2 more"));
        let long = PreflightSummary::of(1, vec!["é".repeat(LINE_CHARS + 10)]);
        assert_eq!(long.problems[0].chars().count(), LINE_CHARS + 1);
        assert_eq!(long.listed(), long.problems[0]);
        let text = serde_json::to_string(&PreflightSummary::of(3, vec![])).unwrap();
        assert_eq!(text, r#"{"constraints_checked":3,"at_risk":0}"#);
        let back: PreflightSummary = serde_json::from_str(&text).unwrap();
        assert_eq!(back, PreflightSummary::of(3, vec![]));
    }
}
