//! The quick start of `docs/quickstart.md` (and of the README, which must show the same
//! commands), run exactly as written: every `sh` block in order, in one bash, with the `larch` of
//! this build on PATH instead of the build block. It runs in fresh network and mount namespaces
//! (an empty loopback, so its fixed ports are free; a tmpfs on /var/tmp, so its directory is
//! private), and a PID namespace that takes every process it started down with it.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// The build block is marked so in the doc; the test runs the larch it was built with instead.
const BUILD_MARKER: &str = "<!-- quickstart: build";

/// The `sh` blocks of a Markdown text, each with whether the build marker precedes it.
fn sh_blocks(markdown: &str) -> Vec<(bool, String)> {
    let mut blocks = Vec::new();
    let mut lines = markdown.lines();
    let mut marked = false;
    while let Some(line) = lines.next() {
        if line.starts_with(BUILD_MARKER) {
            marked = true;
        } else if line.trim_end() == "```sh" {
            let body: Vec<&str> = lines
                .by_ref()
                .take_while(|l| l.trim_end() != "```")
                .collect();
            blocks.push((marked, body.join("\n")));
            marked = false;
        }
    }
    blocks
}

/// The README's quick-start section: from its heading to the next `## `.
fn readme_quickstart(readme: &str) -> &str {
    let start = readme
        .find("## Quick start without Kubernetes")
        .expect("the README has a quick start without Kubernetes");
    let rest = &readme[start + 3..];
    &readme[start..start + 3 + rest.find("\n## ").unwrap_or(rest.len())]
}

#[test]
fn the_readme_shows_the_quickstart_commands() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/quickstart.md")).unwrap();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let doc_blocks: Vec<String> = sh_blocks(&doc).into_iter().map(|b| b.1).collect();
    let readme_blocks: Vec<String> = sh_blocks(readme_quickstart(&readme))
        .into_iter()
        .map(|b| b.1)
        .collect();
    assert_eq!(
        readme_blocks.join("\n"),
        doc_blocks.join("\n"),
        "the README's quick start and docs/quickstart.md differ"
    );
}

#[test]
fn the_quickstart_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/quickstart.md")).unwrap();
    let blocks = sh_blocks(&doc);
    let build: Vec<&String> = blocks.iter().filter(|b| b.0).map(|b| &b.1).collect();
    assert_eq!(build.len(), 1, "one build block");
    assert!(
        build[0].contains("cargo build --release --locked --bin larch")
            && build[0].contains("target/release"),
        "the build block builds the larch binary and puts it on PATH: {}",
        build[0]
    );
    let steps: Vec<&String> = blocks.iter().filter(|b| !b.0).map(|b| &b.1).collect();
    assert!(steps.len() >= 6, "{steps:?}");

    let t0 = Instant::now();
    let out = run_in_namespaces(&steps, "");
    let secs = t0.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the quick start failed ({:?}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    eprintln!("the quick start took {secs:.1} s");
    let step = |i: usize| {
        let from = stdout
            .find(&format!("#### step {i}\n"))
            .unwrap_or_else(|| panic!("no step {i}: {stdout}"));
        let rest = &stdout[from..];
        let end = rest[1..].find("#### ").map_or(rest.len(), |n| n + 1);
        rest[..end].to_string()
    };
    assert!(stdout.contains("#### done"), "{stdout}");

    // steps: 0 PostgreSQL, 1 export, 2 engine, 3 query, 4 change, 5 inspect, 6 clean up
    assert!(step(2).contains(r#"{"ready":true}"#), "{}", step(2));
    let query = step(3);
    let row: serde_json::Value = serde_json::from_str(query.lines().nth(1).unwrap()).unwrap();
    assert_eq!(row["id"], 42, "{query}");
    assert_eq!(row["tenant"], "tenant-42", "{query}");
    assert_eq!(row["kind"], "click", "42 % 3 == 0 in events.sql: {query}");
    let page: serde_json::Value = serde_json::from_str(query.lines().nth(2).unwrap()).unwrap();
    let rows = page["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{query}");
    assert!(rows.iter().all(|r| r["tenant"] == "tenant-7"), "{query}");
    assert_eq!(rows[0]["id"], 7, "primary-key order: {query}");
    assert_eq!(rows[1]["id"], 107, "{query}");

    let change = step(4);
    assert!(change.contains("UPDATE 1"), "{change}");
    let last = change.lines().last().unwrap();
    let changed: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(changed["kind"], "quickstart", "{change}");
    assert_eq!(
        changed["tenant"], "tenant-42",
        "the rest of the row is kept: {change}"
    );

    let inspect = step(5);
    for want in [
        "table:        public.events",
        "manifest:     public.events/manifest.json",
        "key fields:   id",
        "snapshot epoch=1",
        "rows=1000",
        "changes=1",
        "reaches",
        "(the head)",
    ] {
        assert!(inspect.contains(want), "{want:?} missing:\n{inspect}");
    }
    assert!(inspect.contains("  id "), "columns listed: {inspect}");
}

/// Runs `steps` (the doc's blocks, verbatim) after `prelude`, in one `set -euo pipefail` bash in
/// fresh network, mount and PID namespaces: lo up in the empty network, /var/tmp private.
fn run_in_namespaces(steps: &[&String], prelude: &str) -> std::process::Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let larch = Path::new(env!("CARGO_BIN_EXE_larch"));
    let mut script = format!(
        "set -euo pipefail\ncd {}\nexport PATH={}:$PATH\n{prelude}\n",
        root.display(),
        larch.parent().unwrap().display()
    );
    for (i, step) in steps.iter().enumerate() {
        script.push_str(&format!("echo '#### step {i}'\n{step}\n"));
    }
    script.push_str("echo '#### done'\n");
    let inner = format!(
        "ip link set lo up && mount -t tmpfs -o mode=1777 tmpfs /var/tmp && exec timeout 240 bash -c {}",
        shell_quote(&script)
    );
    Command::new("unshare")
        .args([
            "--net",
            "--mount",
            "--propagation",
            "private",
            "--pid",
            "--fork",
            "--kill-child",
            "bash",
            "-c",
        ])
        .arg(&inner)
        .output()
        .expect("running unshare (util-linux)")
}

/// A port of the quick start taken by another program: the commands stop at the wait for the
/// engine (exit 1, not the 240 s timeout's 124), showing the log that names the port.
#[test]
fn the_quickstart_fails_fast_when_a_port_is_taken() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/quickstart.md")).unwrap();
    let blocks = sh_blocks(&doc);
    let steps: Vec<&String> = blocks.iter().filter(|b| !b.0).map(|b| &b.1).collect();
    for (port, log) in [(8080, "engine.log"), (8081, "export.log")] {
        let squat = format!(
            "python3 -c 'import socket,time; s=socket.socket(); s.bind((\"127.0.0.1\",{port})); s.listen(); time.sleep(300)' & disown\nsleep 0.5"
        );
        let out = run_in_namespaces(&steps, &squat);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let all = format!("--- stdout\n{stdout}\n--- stderr\n{stderr}");
        assert_eq!(out.status.code(), Some(1), "port {port}: {all}");
        assert!(
            !stdout.contains("#### step 3"),
            "port {port}: stopped at the wait: {all}"
        );
        assert!(
            stdout.contains(&format!("{log} <==")) && stdout.contains(&format!("127.0.0.1:{port}")),
            "port {port}: the log naming the port is shown: {all}"
        );
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
