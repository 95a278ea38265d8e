//! The keyed filter of raw values, the spellings a raw value can take in an archive, and the
//! pieces of an archive's string that are looked up.

use std::hash::Hasher;

use siphasher::sip128::{Hasher128, SipHasher13};

/// Bits per spelling the filter is sized for: with [`PROBES`] probes, about 0.05 % false
/// candidates, each confirmed or dropped by the exact second pass.
const BITS_PER_SPELLING: u64 = 24;
const PROBES: u64 = 11;
/// The filter never grows past 256 MiB, however big the table (more false candidates instead).
const MAX_BITS: u64 = 1 << 31;
const MIN_BITS: u64 = 1 << 16;

/// A Bloom filter over keyed 128-bit SipHashes (a random key per run, so its bits say nothing
/// about the values to whoever sees them, and no input is crafted to collide).
pub struct KeyedFilter {
    words: Vec<u64>,
    mask: u64,
    keys: (u64, u64),
}

impl KeyedFilter {
    /// A filter for about `expected` spellings.
    pub fn with_capacity(expected: u64) -> KeyedFilter {
        let bits = (expected.saturating_mul(BITS_PER_SPELLING))
            .clamp(MIN_BITS, MAX_BITS)
            .next_power_of_two()
            .min(MAX_BITS);
        KeyedFilter {
            words: vec![0; (bits / 64) as usize],
            mask: bits - 1,
            keys: random_keys(),
        }
    }

    /// The filter's size in bytes.
    pub fn bytes(&self) -> usize {
        self.words.len() * 8
    }

    fn probes(&self, s: &str) -> impl Iterator<Item = u64> + use<> {
        let mut h = SipHasher13::new_with_keys(self.keys.0, self.keys.1);
        h.write(s.as_bytes());
        let hash = h.finish128();
        let (a, b, mask) = (hash.h1, hash.h2 | 1, self.mask);
        (0..PROBES).map(move |i| a.wrapping_add(i.wrapping_mul(b)) & mask)
    }

    pub fn insert(&mut self, s: &str) {
        for bit in self.probes(s) {
            self.words[(bit / 64) as usize] |= 1 << (bit % 64);
        }
    }

    pub fn may_contain(&self, s: &str) -> bool {
        self.probes(s)
            .all(|bit| self.words[(bit / 64) as usize] & (1 << (bit % 64)) != 0)
    }
}

/// Two random 64-bit keys, from the standard library's per-process random SipHash keys.
fn random_keys() -> (u64, u64) {
    use std::hash::BuildHasher;
    let state = std::collections::hash_map::RandomState::new();
    (
        state.hash_one(0x6c65_616bu64),
        state.hash_one(0x6368_6563u64),
    )
}

/// The spellings of raw value `v` an archive can hold, each at least `min_len` characters, into
/// `out` (cleared first): as stored, JSON-escaped (serde's and all-ASCII `\uXXXX`), and for
/// uuids and emails lower and upper case, uuids also without their dashes.
pub fn spellings(v: &str, min_len: usize, out: &mut Vec<String>) {
    out.clear();
    let mut push = |s: String| {
        if s.chars().count() >= min_len && !out.contains(&s) {
            out.push(s);
        }
    };
    push(v.to_string());
    let escaped = serde_json::to_string(v).expect("a string serializes");
    push(escaped[1..escaped.len() - 1].to_string());
    if !v.is_ascii() {
        push(ascii_json_escape(v));
    }
    let uuid = is_uuid(v);
    if uuid || v.contains('@') {
        push(v.to_lowercase());
        push(v.to_uppercase());
    }
    if uuid {
        let bare: String = v.chars().filter(|c| *c != '-').collect();
        push(bare.to_lowercase());
        push(bare.to_uppercase());
    }
}

fn is_uuid(v: &str) -> bool {
    v.len() == 36
        && v.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// JSON string escaping with every non-ASCII character as `\uXXXX` (UTF-16), as encoders that
/// emit ASCII only write it.
fn ascii_json_escape(v: &str) -> String {
    let escaped = serde_json::to_string(v).expect("a string serializes");
    let mut out = String::with_capacity(escaped.len() + 8);
    for c in escaped[1..escaped.len() - 1].chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

/// What of an archive's string `s` is looked up: the whole string, and each token of free
/// text (split on white space and punctuation that neither an email, a uuid nor a JSON escape
/// holds), also with surrounding quotes and sentence punctuation trimmed.
pub fn pieces(s: &str, mut f: impl FnMut(&str)) {
    f(s);
    let separators = |c: char| {
        c.is_whitespace()
            || matches!(
                c,
                ',' | ';'
                    | '('
                    | ')'
                    | '['
                    | ']'
                    | '{'
                    | '}'
                    | '<'
                    | '>'
                    | '='
                    | '|'
                    | '\''
                    | '/'
                    | ':'
                    | '!'
                    | '?'
                    | '&'
                    | '*'
                    | '#'
            )
    };
    if !s.contains(separators) && !s.starts_with(is_trimmed) && !s.ends_with(is_trimmed) {
        return;
    }
    for token in s.split(separators).filter(|t| !t.is_empty()) {
        if token != s {
            f(token);
        }
        let trimmed = token.trim_matches(is_trimmed);
        if trimmed != token && !trimmed.is_empty() {
            f(trimmed);
        }
    }
}

fn is_trimmed(c: char) -> bool {
    matches!(c, '"' | '.' | '`')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_and_email_spellings() {
        let mut out = Vec::new();
        spellings("0E8A2F4C-1B2D-4E5F-8A9B-0C1D2E3F4A5B", 6, &mut out);
        assert!(out.contains(&"0e8a2f4c1b2d4e5f8a9b0c1d2e3f4a5b".to_string()));
        assert!(out.contains(&"0e8a2f4c-1b2d-4e5f-8a9b-0c1d2e3f4a5b".to_string()));
        spellings("Zoë\"Q@Example.com", 6, &mut out);
        assert!(out.contains(&"Zoë\\\"Q@Example.com".to_string()));
        assert!(out.contains(&"Zo\\u00eb\\\"Q@Example.com".to_string()));
        assert!(out.contains(&"zoë\"q@example.com".to_string()));
        spellings("Bob", 6, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn free_text_tokens_and_filter() {
        let mut seen = Vec::new();
        pieces("mail me at ann@x.org. (or \"b\\\"c@y.org\")", |p| {
            seen.push(p.to_string())
        });
        assert!(seen.contains(&"ann@x.org".to_string()));
        assert!(seen.contains(&"b\\\"c@y.org".to_string()));
        let mut f = KeyedFilter::with_capacity(10);
        f.insert("ann@x.org");
        assert!(f.may_contain("ann@x.org"));
        assert!(!f.may_contain("ann@x.orh"));
    }
}
