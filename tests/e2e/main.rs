//! End-to-end scenarios of the operator (issue 6) against a real control plane: a real
//! kube-apiserver accepts the CRDs and validates the CEL rules, a real kube-controller-manager
//! runs the Jobs, Deployments and StatefulSets the operator creates, the fake kubelet runs their
//! pods as this build's `larch`, and the data really flows PostgreSQL 15 → SeaweedFS → engine.
//!
//! One environment per test process (see `support`); scenarios run one at a time.
//! Run: `cargo test --test e2e` (needs `bash e2e/build.sh` once; see e2e/README.md).
//!
//! Scenarios live in topic files (`oneshot.rs`, `continuous.rs`, …); `helpers.rs` holds what
//! several of them use, `support.rs` the environment.

mod continuous;
mod failure_conditions;
mod fleet;
mod garbage_collection;
mod gitops;
mod helpers;
mod install;
mod invalid_crs;
mod leak_checked_seeds;
mod masked_seeds;
mod monitoring;
mod multi_tenancy;
mod oneshot;
mod operator_rights;
mod parallel_export;
mod pod_security;
mod progress;
mod restore;
mod seed_restores;
mod slot_collisions;
mod source_cleanup;
mod split_export;
mod status_actions;
mod status_command;
mod support;
