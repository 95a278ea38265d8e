//! source tests, by topic.

mod conditions;
mod controller;
