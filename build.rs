//! `larch --version`: `larch 0.1.0 (commit 0123456789ab, built 2026-12-04)`. The commit is
//! `LARCH_GIT_COMMIT` when set (the image build and the release workflow pass it: a Docker
//! context has no .git), else `git rev-parse` in release builds, else `unknown`. Debug builds
//! read no git and say `debug build` instead of a date, so that a commit or a new day does not
//! rebuild everything that links the library.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=LARCH_GIT_COMMIT");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    println!("cargo:rerun-if-changed=build.rs");
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    let commit = std::env::var("LARCH_GIT_COMMIT")
        .ok()
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
        .or_else(|| release.then(git_head).flatten())
        .unwrap_or_else(|| "unknown".to_string());
    let built = if release {
        format!("built {}", build_date())
    } else {
        "debug build".to_string()
    };
    let version = env!("CARGO_PKG_VERSION");
    println!("cargo:rustc-env=LARCH_VERSION={version} (commit {commit}, {built})");
}

/// The build's UTC date, `SOURCE_DATE_EPOCH`'s when set (reproducible builds).
fn build_date() -> String {
    let seconds = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        });
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = (seconds / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
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
