//! Tests of the shared machinery and of the controllers against a scripted API server.

pub(crate) mod conditions;
mod controllers;
