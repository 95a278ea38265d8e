//! One integration-test binary (heavy dependencies link once); one module per area.

mod cli_archive;
mod fixtures;
