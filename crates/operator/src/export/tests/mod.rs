//! export tests, by topic.

mod conditions;
mod controller;
mod finalizer;
