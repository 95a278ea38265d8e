//! Export: PostgreSQL into an archive. One-shot (a base snapshot, a new epoch) or continuous
//! (a snapshot, then diffs until stopped, re-based by the policy).

pub mod continuous;
