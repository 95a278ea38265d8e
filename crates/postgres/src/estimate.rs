//! The planner's row estimate of a table, which progress reports count against.

/// The planner's row estimate from `pg_class`: the density `reltuples / relpages` times the
/// pages now; `reltuples` itself when it was measured on no pages; None when never measured.
pub fn estimate_from_catalog(reltuples: f64, relpages: f64, pages_now: f64) -> Option<u64> {
    if reltuples < 0.0 {
        return None;
    }
    if relpages > 0.0 {
        return Some((reltuples / relpages * pages_now).round() as u64);
    }
    Some(reltuples.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::estimate_from_catalog;

    #[test]
    fn the_estimate_scales_the_measured_density_to_the_pages_now() {
        // Analyzed at 1 000 rows on 10 pages; the table has grown to 25 pages.
        assert_eq!(estimate_from_catalog(1_000.0, 10.0, 25.0), Some(2_500));
        assert_eq!(estimate_from_catalog(42.0, 0.0, 0.0), Some(42));
        // PostgreSQL 14+: -1 until the first VACUUM or ANALYZE.
        assert_eq!(estimate_from_catalog(-1.0, 0.0, 8.0), None);
    }
}
