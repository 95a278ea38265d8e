//! What every layer of larch shares: the failure reasons of the termination-message contract
//! between the operator and its pods, durations as written in flags and CRDs, progress
//! reports, poison-tolerant locks, TLS files, process telemetry, figures for people and the
//! HTTP serving loop with its limits, retry delays.
//! Nothing here knows the archive, PostgreSQL, the runs or the operator.

pub mod duration;
pub mod failure;
pub mod locks;
pub mod progress;
pub mod progress_line;
pub mod retry;
pub mod serve;
pub mod telemetry;
pub mod tls;
pub mod units;
pub mod version;
