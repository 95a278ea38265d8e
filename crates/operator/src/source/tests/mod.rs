//! source tests, by topic.

mod conditions;
