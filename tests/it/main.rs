//! One integration-test binary (heavy dependencies link once); one module per area.

mod bad_input;
mod cli_archive;
mod fixtures;
mod writer;
