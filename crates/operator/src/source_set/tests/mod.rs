//! source_set tests, by topic.

mod conditions;
mod controller;
