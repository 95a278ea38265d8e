//! Tests of the shared machinery and the harness the controller tests run against.

pub(crate) mod conditions;
pub(crate) mod harness;
