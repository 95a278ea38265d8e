//! The runs: what the `larch` pods do. `export` (PostgreSQL into an archive, one-shot or
//! continuous), `engine` (archives into live targets, served over HTTP), `restore` (an
//! archive into a PostgreSQL database, once), and the archive source the engine reads
//! through (`archive_source`). The operator starts them as pods; the `larch` binary parses
//! their arguments.

pub mod archive_source;
pub mod engine;
pub mod export;
pub mod leak_check;
pub mod reasons;
pub mod restore;
pub mod review;
