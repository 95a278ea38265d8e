//! A clone of the repository is enough: no script, e2e file, test or example reads the project's
//! shared material beside the repository (`../shared`: the sample table and the laredo fixtures
//! live in `scripts/sample/` and `tests/fixtures/`). The scan looks at code only: comments are
//! stripped per language first, so a comment that mentions the old location does not fail it,
//! and a path inside a string or a command is found even next to a comment.

use std::path::{Path, PathBuf};

/// What a reference to the shared directory looks like in code: a path segment `shared/` (not
/// part of a longer name such as `bin-shared/`) or the quoted directory name `"shared"`.
fn references_shared(code: &str) -> Option<String> {
    let bytes = code.as_bytes();
    let mut from = 0;
    while let Some(i) = code[from..].find("shared") {
        let at = from + i;
        from = at + "shared".len();
        let before = if at == 0 { b' ' } else { bytes[at - 1] };
        let after = bytes.get(from).copied().unwrap_or(b' ');
        let path_segment =
            !(before.is_ascii_alphanumeric() || b"_-".contains(&before)) && after == b'/';
        let quoted_name = (before == b'"' && after == b'"') || (before == b'\'' && after == b'\'');
        if path_segment || quoted_name {
            let line_start = code[..at].rfind('\n').map_or(0, |n| n + 1);
            let line_end = code[at..].find('\n').map_or(code.len(), |n| at + n);
            return Some(code[line_start..line_end].trim().to_string());
        }
    }
    None
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Lang {
    /// `//` and `/* */` comments; `"…"`, raw `r#"…"#` and char literals (Rust, Go).
    CLike,
    /// `#` comments after whitespace or at the start of a line; `'…'` and `"…"` quotes (shell,
    /// YAML, TOML, Python, Dockerfile).
    Hash,
}

fn lang_of(path: &Path) -> Option<Lang> {
    let name = path.file_name()?.to_str()?;
    match path.extension().and_then(|e| e.to_str()) {
        Some("rs" | "go") => Some(Lang::CLike),
        Some("sh" | "bash" | "yaml" | "yml" | "toml" | "py" | "tpl" | "txt") => Some(Lang::Hash),
        None if name == "Dockerfile" || name == "Makefile" => Some(Lang::Hash),
        // Extension-less scripts with a shebang.
        None => std::fs::read_to_string(path)
            .ok()
            .filter(|t| t.starts_with("#!"))
            .map(|_| Lang::Hash),
        _ => None,
    }
}

/// The text with comments replaced by spaces (newlines kept, so lines still line up).
fn strip_comments(text: &str, lang: Lang) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match lang {
            Lang::CLike if c == '/' && next == Some('/') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            Lang::CLike if c == '/' && next == Some('*') => {
                i += 2;
                while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                    out.push(blank(chars[i]));
                    i += 1;
                }
                i += 2;
            }
            Lang::CLike if c == 'r' && matches!(next, Some('"' | '#')) => {
                // raw string r"…", r#"…"#
                let mut j = i + 1;
                let mut hashes = 0;
                while chars.get(j) == Some(&'#') {
                    hashes += 1;
                    j += 1;
                }
                if chars.get(j) != Some(&'"') {
                    out.push(c);
                    i += 1;
                    continue;
                }
                let close: String = std::iter::once('"')
                    .chain(std::iter::repeat_n('#', hashes))
                    .collect();
                let body_start = j + 1;
                let rest: String = chars[body_start..].iter().collect();
                let end = rest.find(&close).map_or(chars.len(), |n| {
                    body_start + rest[..n].chars().count() + close.chars().count()
                });
                out.extend(&chars[i..end]);
                i = end;
            }
            Lang::CLike if c == '\'' => {
                // a char literal ('"', '\'', 'x'), or a lifetime
                let end = match (next, chars.get(i + 2), chars.get(i + 3)) {
                    (Some('\\'), _, _) => chars[i + 2..]
                        .iter()
                        .position(|&c| c == '\'')
                        .map(|n| i + 3 + n),
                    (Some(_), Some('\''), _) => Some(i + 3),
                    _ => None,
                };
                let end = end.unwrap_or(i + 1);
                out.extend(&chars[i..end]);
                i = end;
            }
            Lang::CLike if c == '"' || c == '`' => {
                let end = quoted_end(&chars, i, c, c == '"');
                out.extend(&chars[i..end]);
                i = end;
            }
            Lang::Hash if c == '#' && (i == 0 || chars[i - 1].is_whitespace()) => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            Lang::Hash if c == '"' || c == '\'' => {
                let end = quoted_end(&chars, i, c, c == '"');
                out.extend(&chars[i..end]);
                i = end;
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// The index after the closing `quote` of the literal opening at `start`.
fn quoted_end(chars: &[char], start: usize, quote: char, escapes: bool) -> usize {
    let mut j = start + 1;
    while j < chars.len() {
        if escapes && chars[j] == '\\' {
            j += 2;
            continue;
        }
        if chars[j] == quote {
            return j + 1;
        }
        j += 1;
    }
    chars.len()
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().to_string();
        if p.is_dir() {
            // build output and data (the fixtures are archives, not code)
            if name != "target" && name != "fixtures" && !name.starts_with('.') {
                files_under(&p, out);
            }
        } else {
            out.push(p);
        }
    }
}

#[test]
fn nothing_under_scripts_e2e_tests_examples_reads_the_shared_directory() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let this_file = root.join(file!().trim_start_matches("./"));
    let mut files = Vec::new();
    for dir in ["scripts", "e2e", "tests", "examples"] {
        files_under(&root.join(dir), &mut files);
    }
    files.push(root.join("Dockerfile"));
    files.push(root.join(".ci/run"));
    let mut scanned = 0;
    let mut found = Vec::new();
    for f in &files {
        // This file spells out the pattern it looks for.
        if f.ends_with("tests/it/self_contained.rs") || *f == this_file {
            continue;
        }
        let Some(lang) = lang_of(f) else { continue };
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        scanned += 1;
        if let Some(line) = references_shared(&strip_comments(&text, lang)) {
            found.push(format!(
                "{}: {line}",
                f.strip_prefix(root).unwrap().display()
            ));
        }
    }
    assert!(
        scanned > 50,
        "only {scanned} files scanned: is the walk broken?"
    );
    assert!(
        found.is_empty(),
        "these read the shared directory beside the repository; use scripts/sample/ or tests/fixtures/ instead:\n{}",
        found.join("\n")
    );
    // What the tests and the e2e environment read instead is in the repository.
    for p in [
        "scripts/sample/events.sql",
        "tests/fixtures/laredo/README.md",
    ] {
        assert!(root.join(p).is_file(), "{p} missing");
    }
}

/// The scan itself: comments that mention the directory are ignored; code that reads it is found,
/// however it sits next to comments, quotes or other literals.
#[test]
fn the_shared_directory_scan_sees_code_and_ignores_comments() {
    let dir = ["..", "shared"].join("/");
    let caught = |text: &str, lang: Lang| references_shared(&strip_comments(text, lang)).is_some();
    for (lang, text) in [
        (
            Lang::Hash,
            format!("# the old {dir}/bench/events.sql\necho hi\n"),
        ),
        (Lang::Hash, format!("echo hi   # was {dir}/x\n")),
        (Lang::CLike, format!("// from {dir}/fixtures\nlet x = 1;\n")),
        (
            Lang::CLike,
            format!("/* {dir}/spec\n   more */ let y = 2;\n"),
        ),
        (Lang::CLike, format!("//! see `{dir}/bench`\n")),
        (
            Lang::CLike,
            "let shared = Shared::new(); shared.status();\n".to_string(),
        ),
        (
            Lang::Hash,
            "ln -s /var/tmp/bin-shared/larch x\n".to_string(),
        ),
    ] {
        assert!(!caught(&text, lang), "a false alarm on {text:?}");
    }
    for (lang, text) in [
        (
            Lang::Hash,
            format!("psql -f \"$here/{dir}/bench/events.sql\"\n"),
        ),
        (
            Lang::Hash,
            format!("sql=$here/{dir}/bench # a comment after it\n"),
        ),
        (Lang::Hash, format!("echo '# not a comment' {dir}/x\n")),
        (Lang::Hash, format!("x=\"a#b\" ; cat {dir}/y\n")),
        (
            Lang::CLike,
            format!("let p = root.join(\"{dir}/fixtures\"); // ok\n"),
        ),
        (
            Lang::CLike,
            format!("let s = \"// not a comment {dir}/x\";\n"),
        ),
        (Lang::CLike, format!("let c = '\"'; let p = \"{dir}/x\";\n")),
        (
            Lang::CLike,
            format!("let r = r#\"a \" b\"#; let p = \"{dir}/x\";\n"),
        ),
        (
            Lang::CLike,
            "let p = root.join(\"..\").join(\"shared\");\n".to_string(),
        ),
        (
            Lang::CLike,
            "fn f<'a>(x: &'a str) { open(\"shared/spec\") }\n".to_string(),
        ),
    ] {
        assert!(caught(&text, lang), "missed {text:?}");
    }
}
