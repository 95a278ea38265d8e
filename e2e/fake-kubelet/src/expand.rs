//! Kubernetes `$(VAR)` expansion, as the kubelet applies it to `command`, `args`, env values and
//! `subPathExpr` (a port of `k8s.io/kubernetes/third_party/forked/golang/expansion`).
//!
//! - `$(NAME)` is replaced by the value of NAME when it is defined, and kept verbatim otherwise;
//! - `$$` is an escaped `$` (so `$$(NAME)` yields the literal `$(NAME)`);
//! - a `$` followed by anything else, an unterminated `$(`, and a trailing `$` are kept as they are.

/// Expands `input` using `lookup` for variable values.
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < bytes.len() {
        if bytes[cursor] == b'$' && cursor + 1 < bytes.len() {
            out.push_str(&input[checkpoint..cursor]);
            let rest = &input[cursor + 1..];
            // number of bytes consumed after the `$`
            let advance = match bytes[cursor + 1] {
                b'$' => {
                    out.push('$');
                    1
                }
                b'(' => match rest[1..].find(')') {
                    Some(end) => {
                        let name = &rest[1..1 + end];
                        match lookup(name) {
                            Some(value) => out.push_str(&value),
                            None => {
                                out.push_str("$(");
                                out.push_str(name);
                                out.push(')');
                            }
                        }
                        end + 2
                    }
                    None => {
                        out.push_str("$(");
                        1
                    }
                },
                _ => {
                    let ch = rest.chars().next().expect("non-empty");
                    out.push('$');
                    out.push(ch);
                    ch.len_utf8()
                }
            };
            cursor += advance + 1;
            checkpoint = cursor;
        } else {
            cursor += 1;
        }
    }
    out.push_str(&input[checkpoint..]);
    out
}

/// Expands with a list of (name, value) pairs; the last definition of a name wins.
pub fn expand_with(input: &str, vars: &[(String, String)]) -> String {
    expand(input, |name| {
        vars.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> Vec<(String, String)> {
        vec![
            ("POD_IP".into(), "127.1.0.5".into()),
            ("EMPTY".into(), String::new()),
            ("NS".into(), "default".into()),
        ]
    }

    #[test]
    fn expands_defined_variables() {
        assert_eq!(
            expand_with("--listen $(POD_IP):8080", &vars()),
            "--listen 127.1.0.5:8080"
        );
        assert_eq!(expand_with("$(NS)/$(POD_IP)", &vars()), "default/127.1.0.5");
        assert_eq!(expand_with("a$(EMPTY)b", &vars()), "ab");
    }

    #[test]
    fn keeps_undefined_and_malformed_references() {
        assert_eq!(expand_with("$(NOPE)", &vars()), "$(NOPE)");
        assert_eq!(expand_with("x $(POD_IP", &vars()), "x $(POD_IP");
        assert_eq!(expand_with("$", &vars()), "$");
        assert_eq!(expand_with("cost: 5$", &vars()), "cost: 5$");
        assert_eq!(expand_with("$HOME and ${NS}", &vars()), "$HOME and ${NS}");
        assert_eq!(expand_with("€$é", &vars()), "€$é");
    }

    #[test]
    fn escapes() {
        assert_eq!(expand_with("$$(POD_IP)", &vars()), "$(POD_IP)");
        assert_eq!(expand_with("$$$(POD_IP)", &vars()), "$127.1.0.5");
        assert_eq!(expand_with("$$", &vars()), "$");
        assert_eq!(expand_with("$$$$", &vars()), "$$");
    }

    #[test]
    fn no_recursive_expansion() {
        let v = vec![
            ("A".to_string(), "$(B)".to_string()),
            ("B".to_string(), "b".to_string()),
        ];
        assert_eq!(expand_with("$(A)", &v), "$(B)");
    }

    #[test]
    fn later_definition_wins() {
        let v = vec![
            ("A".to_string(), "1".to_string()),
            ("A".to_string(), "2".to_string()),
        ];
        assert_eq!(expand_with("$(A)", &v), "2");
    }
}
