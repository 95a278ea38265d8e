//! source tests, by topic.

mod build;
mod conditions;
mod controller;
