//! Times as the operator writes them into statuses and conditions.

use jiff::Timestamp;

/// RFC 3339 at second precision, as Kubernetes writes times.
pub fn time_string(t: Timestamp) -> String {
    t.round(jiff::Unit::Second).unwrap_or(t).to_string()
}
