//! larch: PostgreSQL tables into laredo-compatible archives, archives into live engines, both
//! on Kubernetes through an operator.

pub mod archive;
pub mod cli;
pub mod duration;
pub mod engine;
pub mod export;
pub mod failure;
pub mod locks;
pub mod operator;
pub mod progress;
pub mod restore;
pub mod source;
pub mod telemetry;
pub mod tls;
