//! The running binary's version, as `larch --version` prints it (with its commit), for what
//! the library crates record (a manifest's leak check). The binary sets it once at start.

use std::sync::OnceLock;

static VERSION: OnceLock<String> = OnceLock::new();

/// Sets the version; later calls change nothing.
pub fn set(version: &str) {
    let _ = VERSION.set(version.to_string());
}

/// The version the binary set, else this crate's package version (tests, library users).
pub fn get() -> &'static str {
    VERSION
        .get()
        .map(String::as_str)
        .unwrap_or(env!("CARGO_PKG_VERSION"))
}
