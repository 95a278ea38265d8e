//! export tests, by topic.

mod conditions;
