//! source_set tests, by topic.

mod conditions;
