//! export tests, by topic.

mod build;
mod conditions;
mod controller;
mod finalizer;
