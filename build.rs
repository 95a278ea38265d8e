//! `larch --version`: the package version, plus the commit in release builds
//! (`LARCH_GIT_COMMIT` if set, as the image build passes it, else `git rev-parse`). Debug builds
//! leave the commit out so that a commit does not rebuild everything that links the library.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=LARCH_GIT_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    let commit = std::env::var("LARCH_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| release.then(git_head).flatten());
    let version = env!("CARGO_PKG_VERSION");
    let full = match commit {
        Some(c) => format!("{version} (commit {})", c.trim()),
        None => version.to_string(),
    };
    println!("cargo:rustc-env=LARCH_VERSION={full}");
}

/// The checked-out commit, watching the files that change with it.
fn git_head() -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    for path in ["HEAD", "packed-refs"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(p) = git(&["rev-parse", "--git-path", &reference])
    {
        println!("cargo:rerun-if-changed={p}");
    }
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty {
        format!("{commit}, modified")
    } else {
        commit
    })
}
