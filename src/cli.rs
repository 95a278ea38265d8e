//! The `larch` command line: argument parsing, wiring, exit codes.

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "larch",
    version,
    about = "PostgreSQL tables into laredo-compatible archives, archives into live engines"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Inspect, verify and reconstruct archives.
    #[command(subcommand)]
    Archive(ArchiveCommand),
}

#[derive(Subcommand, Debug)]
pub enum ArchiveCommand {}

/// Runs the CLI and returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match cli.command {
        Command::Archive(c) => match c {},
    }
}
