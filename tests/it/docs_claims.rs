//! What the docs name exists: every `--flag` written after a `larch` command in README.md and
//! docs/*.md is a flag of that command, and every `LARCH_*` variable they name is read by the
//! code. (The metrics they name are checked against the binaries' /metrics in `observability`.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The command tree: a command path and its subcommands.
const SUBCOMMANDS: &[(&str, &[&str])] = &[
    (
        "",
        &[
            "export", "archive", "engine", "restore", "operator", "crd", "status",
        ],
    ),
    ("export", &["cleanup", "slot-status", "split-worker"]),
    (
        "engine",
        &[
            "status", "ready", "tables", "query", "pause", "resume", "reload",
        ],
    ),
    ("engine query", &["count", "get", "list", "lookup"]),
    (
        "archive",
        &[
            "export",
            "inspect",
            "verify",
            "reconstruct",
            "gc",
            "leak-check",
        ],
    ),
];

fn docs() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            files.push(e.path());
        }
    }
    files
        .into_iter()
        .map(|f| {
            let name = f.strip_prefix(root).unwrap().display().to_string();
            (name, std::fs::read_to_string(&f).unwrap())
        })
        .collect()
}

/// The shell text of a Markdown file with its line numbers: the lines of fenced blocks (a line
/// ending in `\` joined with the next) and the inline code spans of the other lines.
fn shell_text(markdown: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    let mut pending: Option<(usize, String)> = None;
    for (n, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            let (start, mut joined) = pending.take().unwrap_or((n, String::new()));
            joined.push_str(line.trim_end_matches('\\'));
            joined.push(' ');
            if line.ends_with('\\') {
                pending = Some((start, joined));
            } else {
                out.push((start, joined));
            }
        } else {
            for span in line.split('`').skip(1).step_by(2) {
                out.push((n, span.to_string()));
            }
        }
    }
    out
}

/// `larch` commands in a line of text and the flags written after each, up to the end of the
/// shell command (`|`, `;`, `&&`, a closing backtick).
fn commands_in(line: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let mut found = Vec::new();
    let words: Vec<&str> = line
        .split(|c: char| c.is_whitespace() || c == '`' || c == '(' || c == ')')
        .collect();
    let mut i = 0;
    while i < words.len() {
        if words[i] != "larch" {
            i += 1;
            continue;
        }
        i += 1;
        let mut path: Vec<String> = Vec::new();
        while i < words.len() {
            let here = path.join(" ");
            let subs = SUBCOMMANDS
                .iter()
                .find(|(p, _)| *p == here)
                .map_or(&[][..], |(_, s)| *s);
            if subs.contains(&words[i]) {
                path.push(words[i].to_string());
                i += 1;
            } else {
                break;
            }
        }
        let mut flags = Vec::new();
        while i < words.len() && !matches!(words[i], "|" | ";" | "&&" | "||" | "larch") {
            let w = words[i].trim_end_matches([',', '.', ':', ']', '\\']);
            if let Some(flag) = w.strip_prefix("--") {
                let name = flag.split('=').next().unwrap();
                if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                    flags.push(format!("--{name}"));
                }
            }
            i += 1;
        }
        if !path.is_empty() {
            found.push((path, flags));
        }
    }
    found
}

/// The flags of `larch <path>`, as `cli_archive` reads them from its `--help`.
fn flags_of(path: &[String]) -> BTreeSet<String> {
    let args: Vec<&str> = path.iter().map(String::as_str).collect();
    let mut flags: BTreeSet<String> = crate::cli_archive::flags_of(&args).into_iter().collect();
    flags.insert("--version".to_string());
    flags
}

#[test]
fn every_flag_the_docs_write_after_a_larch_command_exists() {
    let mut known: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (file, text) in docs() {
        for (n, line) in shell_text(&text) {
            for (path, flags) in commands_in(&line) {
                let own = known.entry(path.clone()).or_insert_with(|| flags_of(&path));
                for flag in flags {
                    checked += 1;
                    if !own.contains(&flag) {
                        wrong.push(format!("{file}:{}: larch {} {flag}", n + 1, path.join(" ")));
                    }
                }
            }
        }
    }
    assert!(checked > 100, "the scan found only {checked} flags");
    assert!(
        wrong.is_empty(),
        "flags the docs name that the command does not have:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_larch_variable_the_docs_name_is_read_by_the_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // build.rs reads the build's variables (LARCH_GIT_COMMIT)
    let mut code = std::fs::read_to_string(root.join("build.rs")).unwrap();
    let mut stack = vec![root.join("src"), root.join("crates")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                code.push_str(&std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    // the scripts' variables (scripts/*.sh, e2e/*.sh) are documented too
    for dir in ["scripts", "e2e"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "sh") {
                let script = std::fs::read_to_string(e.path()).unwrap();
                // as the code spells names: quoted
                for word in script.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                    if word.starts_with("LARCH_") {
                        code.push_str(&format!("\"{word}\""));
                    }
                }
            }
        }
    }
    let mut wrong = Vec::new();
    for (file, text) in docs() {
        for (i, _) in text.match_indices("LARCH_") {
            let name: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            let name = name.trim_end_matches('_');
            // the test-only environment of the e2e and bench scripts is documented by them
            if name.starts_with("LARCH_E2E") || name.starts_with("LARCH_BENCH") {
                continue;
            }
            if !code.contains(&format!("\"{name}\"")) {
                wrong.push(format!("{file}: {name}"));
            }
        }
    }
    wrong.sort();
    wrong.dedup();
    assert!(
        wrong.is_empty(),
        "variables the docs name that no code reads:\n{}",
        wrong.join("\n")
    );
}
