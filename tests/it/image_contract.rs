//! The container image's contract (`Dockerfile`), checked without Docker (none on the project's
//! machines): the build stage's context — exactly what it `COPY`s, minus `.dockerignore` — is
//! enough to build the binary offline from the cargo cache; the binary links only libraries the
//! runtime base image (`gcr.io/distroless/cc-debian12`) has, with glibc symbol versions its glibc
//! (2.36) provides. That it runs as UID 65532 on a read-only root filesystem is e2e scenario 17.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Shared libraries of gcr.io/distroless/cc-debian12: glibc (libc6), libssl3, libgcc-s1,
/// libgomp1, libstdc++6, plus the kernel's vDSO.
const BASE_IMAGE_LIBRARIES: &[&str] = &[
    "linux-vdso.so.1",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "libutil.so.1",
    "libresolv.so.2",
    "libanl.so.1",
    "libssl.so.3",
    "libcrypto.so.3",
    "libgcc_s.so.1",
    "libgomp.so.1",
    "libstdc++.so.6",
];
/// glibc of Debian 12, the runtime image's distribution.
const BASE_IMAGE_GLIBC: (u32, u32) = (2, 36);

/// The sources of the build stage's `COPY` instructions (not `COPY --from`), in order. The
/// build stage is the first `FROM` (the `ARG`s of the bases come before it).
fn build_stage_copies(dockerfile: &str) -> Vec<String> {
    let mut stage = 0;
    let mut out = Vec::new();
    for line in dockerfile.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.first().map(|w| w.to_ascii_uppercase()).as_deref() {
            Some("FROM") => stage += 1,
            Some("COPY") if stage == 1 => {
                let args: Vec<&str> = words[1..]
                    .iter()
                    .copied()
                    .filter(|w| !w.starts_with("--"))
                    .collect();
                assert!(
                    !words.iter().any(|w| w.starts_with("--from")),
                    "COPY --from in the build stage: {line}"
                );
                out.extend(args[..args.len() - 1].iter().map(|s| s.to_string()));
            }
            _ => {}
        }
    }
    out
}

/// `*`-only glob on one path segment, as .dockerignore's top-level patterns.
fn glob(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            name.len() >= head.len() + tail.len() && name.starts_with(head) && name.ends_with(tail)
        }
    }
}

/// Whether `.dockerignore` leaves the top-level entry `name` out of the context.
fn ignored(dockerignore: &str, name: &str) -> bool {
    let mut out = false;
    for p in dockerignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        match p.strip_prefix('!') {
            Some(p) if glob(p.trim_start_matches('/'), name) => out = false,
            None if glob(p.trim_start_matches('/'), name) => out = true,
            _ => {}
        }
    }
    out
}

/// The top-level entries of `root` that the build context holds (`.dockerignore` applied).
fn context_entries(root: &Path, dockerignore: &str) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !ignored(dockerignore, name))
        .collect();
    out.sort();
    out
}

/// The target directory this test binary was built into (`…/target/debug/deps/it-…`).
fn target_dir() -> PathBuf {
    let exe = Path::new(env!("CARGO_BIN_EXE_larch"));
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// Hard-links the dependencies this test run already compiled into the context's own target
/// directory (no copy, no disk), so its build compiles larch and only the dependencies whose
/// features differ for a plain `--bin` build. Cargo names every unit by a hash of its
/// configuration, so a linked artifact is used only where it is exactly the one needed, and fresh
/// units are never rewritten. `cp -n` keeps what the context's build made itself.
fn seed_dependencies(debug: &Path) {
    let ours = target_dir().join("debug");
    for dir in ["deps", "build", ".fingerprint"] {
        std::fs::create_dir_all(debug.join(dir)).unwrap();
        let status = Command::new("cp")
            .args(["-a", "-l", "-n"])
            .arg(ours.join(dir).join("."))
            .arg(debug.join(dir))
            .status()
            .unwrap();
        assert!(
            status.success(),
            "linking {dir} into the image context's target"
        );
    }
}

/// The larch package's build-script runs and fingerprints in the image context's target: a
/// previous run's (or a seeded one's) would otherwise stand for this build.rs, and `--version`
/// would print what an older build.rs wrote.
fn forget_larch_build_script(debug: &Path) {
    for dir in ["build", ".fingerprint"] {
        for entry in std::fs::read_dir(debug.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if is_the_larch_package(&name) {
                std::fs::remove_dir_all(&path).unwrap();
            }
        }
    }
}

/// `larch-<hash>`, not a member crate's `larch-archive-<hash>` and the like.
fn is_the_larch_package(dir_name: &str) -> bool {
    dir_name
        .strip_prefix("larch-")
        .is_some_and(|rest| rest.chars().all(|c| c.is_ascii_hexdigit()))
}

#[test]
fn dockerfile_parsing() {
    let d = "FROM rust AS build\nCOPY a b ./\nCOPY --chown=1:1 src ./src\nFROM base\nCOPY --from=build /out/x /x\n";
    assert_eq!(build_stage_copies(d), ["a", "b", "src"]);
    let ignore = "target\n*.md\n!README.md\n";
    assert!(ignored(ignore, "target") && ignored(ignore, "NOTES.md"));
    assert!(!ignored(ignore, "README.md") && !ignored(ignore, "src"));
    let allow = "*\n!Cargo.toml\n!src\n";
    assert!(ignored(allow, "target") && ignored(allow, ".git") && ignored(allow, "README.md"));
    assert!(!ignored(allow, "Cargo.toml") && !ignored(allow, "src"));
    assert!(is_the_larch_package("larch-548903e6cd8e0609"));
    assert!(!is_the_larch_package("larch-archive-548903e6cd8e0609"));
}

/// Builds the binary from a copy of the Docker build context only. The copy keeps modification
/// times and lives at a fixed place with its own target directory, seeded with this run's
/// dependencies (see `seed_dependencies`), so a run recompiles little beyond larch itself.
#[test]
fn the_docker_build_context_builds_a_binary_the_base_image_can_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    let dockerignore = std::fs::read_to_string(root.join(".dockerignore")).unwrap_or_default();
    assert!(
        dockerfile.contains("ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot"),
        "the allowlist is for distroless/cc-debian12, the runtime base by default"
    );
    // `COPY . ./`: the context is what .dockerignore lets through: the workspace (the larch
    // package in src/ with its build.rs, the member crates under crates/) and nothing else.
    assert_eq!(
        build_stage_copies(&dockerfile),
        ["."],
        "update this test with the Dockerfile"
    );
    let copies = context_entries(root, &dockerignore);
    for name in &copies {
        assert!(
            ["Cargo.toml", "Cargo.lock", "build.rs", "src", "crates"].contains(&name.as_str()),
            "{name} is in the build context: .dockerignore should leave it out"
        );
    }
    for needed in ["Cargo.toml", "Cargo.lock", "build.rs", "src", "crates"] {
        assert!(
            copies.iter().any(|c| c == needed),
            "{needed} is not in the build context"
        );
    }

    let work = target_dir().join("image-context");
    let context = work.join("context");
    if context.exists() {
        std::fs::remove_dir_all(&context).unwrap();
    }
    std::fs::create_dir_all(&context).unwrap();
    for src in &copies {
        let status = Command::new("cp")
            .arg("-a")
            .arg(root.join(src))
            .arg(&context)
            .status()
            .unwrap();
        assert!(status.success(), "copying {src}");
    }
    seed_dependencies(&work.join("target/debug"));
    forget_larch_build_script(&work.join("target/debug"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let t0 = std::time::Instant::now();
    let out = Command::new(cargo)
        .args(["build", "--offline", "--locked", "--bin", "larch"])
        .current_dir(&context)
        .env("CARGO_TARGET_DIR", work.join("target"))
        // what the Dockerfile's build argument passes (the context has no .git)
        .env("LARCH_GIT_COMMIT", "0123456789ab")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo build in the Docker context failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "built from the Docker context in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let binary = work.join("target/debug/larch");
    let version = Command::new(&binary).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!(
            "larch {} (commit 0123456789ab, debug build)",
            env!("CARGO_PKG_VERSION")
        )
    );

    let ldd = Command::new("ldd").arg(&binary).output().expect("ldd");
    assert!(ldd.status.success(), "{ldd:?}");
    let ldd = String::from_utf8(ldd.stdout).unwrap();
    let libraries: Vec<&str> = ldd
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(|l| l.rsplit('/').next().unwrap())
        .collect();
    assert!(libraries.contains(&"libc.so.6"), "{ldd}");
    for lib in &libraries {
        assert!(
            BASE_IMAGE_LIBRARIES.contains(lib),
            "{lib} is not in gcr.io/distroless/cc-debian12:\n{ldd}"
        );
    }

    let symbols = Command::new("objdump")
        .arg("-T")
        .arg(&binary)
        .output()
        .expect("objdump (binutils)");
    assert!(symbols.status.success());
    let newest = String::from_utf8_lossy(&symbols.stdout)
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let (major, minor) = v.split_once('.')?;
            Some((
                major.parse::<u32>().ok()?,
                minor.split('.').next()?.parse::<u32>().ok()?,
            ))
        })
        .max()
        .expect("glibc symbol versions");
    assert!(
        newest <= BASE_IMAGE_GLIBC,
        "needs GLIBC_{}.{}, the base image has {}.{}",
        newest.0,
        newest.1,
        BASE_IMAGE_GLIBC.0,
        BASE_IMAGE_GLIBC.1
    );
}
