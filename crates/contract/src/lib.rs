//! The contract between the operator and the pods it runs, typed once: the operator builds
//! these values and writes them; the pods read the same types. Nothing here runs anything.
//!
//! - [`engine_file`]: the engine's configuration file (`larch engine --config engine.yaml`),
//!   which the operator writes into an ArchiveSource's ConfigMap.

pub mod engine_file;
