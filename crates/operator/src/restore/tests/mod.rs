//! restore tests, by topic.

mod conditions;
