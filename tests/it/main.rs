//! One integration-test binary (heavy dependencies link once); one module per area. Tests that
//! need real components (SeaweedFS, PostgreSQL) share one process and one server each
//! (see `support`).

mod archive_build;
mod archive_source;
mod bad_input;
mod bounded_memory;
mod bounded_memory_postgres;
mod census;
mod cli_archive;
mod cli_conventions;
#[cfg(feature = "crashpoints")]
mod crash_safety;
mod docs_claims;
mod engine_access;
mod engine_config;
mod engine_follow;
mod engine_grpc;
mod engine_memory;
mod engine_operability;
mod engine_postgres;
mod engine_support;
mod fixtures;
mod gc_race;
mod hostile_inputs;
mod image_contract;
mod laredo_hocon;
mod leak_check;
mod masking;
mod masking_fakes;
mod masking_key_rotation;
mod masking_subsets;
mod observability;
mod operator_contract;
mod parallel_export;
mod point_in_time;
mod postgres_continuous;
mod postgres_export;
mod postgres_lifecycle;
mod postgres_source;
mod postgres_stream;
mod postgres_tls;
mod quickstart;
mod restore_command;
mod restore_copy;
mod restore_progress;
mod s3_protocol;
mod s3_tls;
mod schema_changes;
mod self_contained;
mod source_conformance;
mod store_conformance;
mod support;
mod target_conformance;
mod tenant_safety;
mod writer;
