//! The keyed filter of raw values, the spellings a raw value can take in an archive, and the
//! pieces of an archive's string that are looked up.

use std::hash::{BuildHasher, Hasher};

/// Bits per spelling the filter is sized for: with [`PROBES`] probes in one block, about
/// 0.005 % false candidates, each confirmed or dropped by the exact second pass.
const BITS_PER_SPELLING: u64 = 24;
const PROBES: u64 = 11;
/// The filter never grows past 256 MiB, however big the table (more false candidates instead).
const MAX_BITS: u64 = 1 << 31;
const MIN_BITS: u64 = 1 << 16;
/// A spelling's probes all fall in one block of 512 bits (a cache line): one memory access per
/// insert or look-up instead of one per probe.
const BLOCK_WORDS: usize = 8;

/// A blocked Bloom filter over keyed 64-bit hashes (foldhash, seeded at random per run).
///
/// The hash needs neither to be a PRF nor collision-resistant against a chosen input: the filter
/// never leaves the process (only counts are reported), a Bloom filter has no false negatives
/// whatever the hash, and a false positive — chance, or a collision crafted by whoever writes
/// archive contents — only sends a string to the exact second pass (at worst past
/// `MAX_CANDIDATES`, an error, never a pass). So a fast keyed hash keeps every guarantee the
/// 128-bit SipHash gave, at a fraction of its cost per spelling.
pub struct KeyedFilter {
    words: Vec<u64>,
    block_mask: u64,
    hasher: foldhash::quality::FixedState,
}

impl KeyedFilter {
    /// A filter for about `expected` spellings.
    pub fn with_capacity(expected: u64) -> KeyedFilter {
        let bits = (expected.saturating_mul(BITS_PER_SPELLING))
            .clamp(MIN_BITS, MAX_BITS)
            .next_power_of_two()
            .min(MAX_BITS);
        let blocks = bits / (64 * BLOCK_WORDS as u64);
        KeyedFilter {
            words: vec![0; (bits / 64) as usize],
            block_mask: blocks - 1,
            hasher: foldhash::quality::FixedState::with_seed(random_seed()),
        }
    }

    /// The filter's size in bytes.
    pub fn bytes(&self) -> usize {
        self.words.len() * 8
    }

    /// The first word of `s`'s block and the bits it sets there.
    fn probes(&self, s: &[u8]) -> (usize, [u64; BLOCK_WORDS]) {
        let mut h = self.hasher.build_hasher();
        h.write(s);
        let h1 = h.finish();
        // 121 bits from one 64-bit hash: the second word is a bijective mix of the first, so
        // two spellings share probes only if their 64-bit hashes collide (about 1 in 2^64).
        let h2 = mix(h1);
        // The block takes at most the low 22 bits of h1 (MAX_BITS / 512 blocks); each probe
        // takes 9 more bits of its own (seven from h2, four from the rest of h1): independent
        // probes, where double hashing inside a block would make colliding patterns.
        let block = (h1 & self.block_mask) as usize * BLOCK_WORDS;
        let (mut low, mut high) = (h2, h1 >> 22);
        let mut bits = [0u64; BLOCK_WORDS];
        for i in 0..PROBES {
            let source = if i < 7 { &mut low } else { &mut high };
            let bit = *source & 511;
            *source >>= 9;
            bits[(bit / 64) as usize] |= 1 << (bit % 64);
        }
        (block, bits)
    }

    pub fn insert(&mut self, s: &str) {
        let (block, bits) = self.probes(s.as_bytes());
        for (w, b) in self.words[block..block + BLOCK_WORDS].iter_mut().zip(bits) {
            *w |= b;
        }
    }

    pub fn may_contain(&self, s: &str) -> bool {
        let (block, bits) = self.probes(s.as_bytes());
        self.words[block..block + BLOCK_WORDS]
            .iter()
            .zip(bits)
            .all(|(w, b)| w & b == b)
    }
}

/// A random 64-bit seed, from the standard library's per-process random SipHash keys (foldhash
/// is built without its `std` feature, as hashbrown uses it).
fn random_seed() -> u64 {
    std::collections::hash_map::RandomState::new().hash_one(0x6c65_616b_6368_6563u64)
}

/// MurmurHash3's 64-bit finalizer: a bijection whose every output bit depends on every input
/// bit.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The spellings of one raw value an archive can hold, each at least `min_len` characters, in
/// one reused buffer (no allocation per value once it has grown): as stored, JSON-escaped
/// (serde's and all-ASCII `\uXXXX`), and for uuids and emails lower and upper case, uuids also
/// without their dashes.
#[derive(Default)]
pub struct Spellings {
    text: String,
    ends: Vec<usize>,
    /// A value's JSON escape, written here rather than allocated per value.
    escaped: Vec<u8>,
}

impl Spellings {
    /// Replaces the spellings with those of `v`.
    pub fn of(&mut self, v: &str, min_len: usize) {
        self.text.clear();
        self.ends.clear();
        if v.len() < min_len {
            return; // never fewer bytes than characters, and no spelling is shorter than `v`
        }
        self.push(v, min_len);
        if v.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
            let mut escaped = std::mem::take(&mut self.escaped);
            escaped.clear();
            serde_json::to_writer(&mut escaped, v).expect("a string serializes");
            let inner = std::str::from_utf8(&escaped[1..escaped.len() - 1]).expect("JSON is UTF-8");
            self.push(inner, min_len);
            self.escaped = escaped;
        }
        if !v.is_ascii() {
            self.push(&ascii_json_escape(v), min_len);
        }
        let uuid = is_uuid(v);
        // case only changes letters: an ASCII value without any has a single spelling
        let has_case = !v.is_ascii() || v.bytes().any(|b| b.is_ascii_alphabetic());
        if (uuid || v.contains('@')) && has_case {
            self.push_cased(v, min_len);
        }
        if uuid {
            let mut bare = [0u8; 32];
            for (to, from) in bare.iter_mut().zip(v.bytes().filter(|b| *b != b'-')) {
                *to = from;
            }
            let bare = std::str::from_utf8(&bare).expect("a uuid is ASCII");
            self.push(bare, min_len);
            self.push_cased(bare, min_len);
        }
    }

    /// `v` in lower and in upper case.
    fn push_cased(&mut self, v: &str, min_len: usize) {
        if v.is_ascii() {
            for upper in [false, true] {
                let start = self.text.len();
                self.text.push_str(v);
                let (text, added) = (&mut self.text, start..);
                if upper {
                    text[added].make_ascii_uppercase();
                } else {
                    text[added].make_ascii_lowercase();
                }
                self.commit(start, min_len);
            }
        } else {
            self.push(&v.to_lowercase(), min_len);
            self.push(&v.to_uppercase(), min_len);
        }
    }

    fn push(&mut self, s: &str, min_len: usize) {
        let start = self.text.len();
        self.text.push_str(s);
        self.commit(start, min_len);
    }

    /// Keeps the spelling written from `start` on if it is long enough and new.
    fn commit(&mut self, start: usize, min_len: usize) {
        let s = &self.text[start..];
        let long_enough = s.len() >= min_len && (s.is_ascii() || s.chars().count() >= min_len);
        if long_enough && !self.iter().any(|t| t == s) {
            self.ends.push(self.text.len());
        } else {
            self.text.truncate(start);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(self.ends.iter().copied())
            .map(|(a, b)| &self.text[a..b])
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

    fn spellings(v: &str, min_len: usize) -> Vec<String> {
        let mut s = Spellings::default();
        s.of(v, min_len);
        s.iter().map(str::to_string).collect()
    }

    #[test]
    fn uuid_and_email_spellings() {
        assert_eq!(
            spellings("0E8A2F4C-1B2D-4E5F-8A9B-0C1D2E3F4A5B", 6),
            [
                "0E8A2F4C-1B2D-4E5F-8A9B-0C1D2E3F4A5B",
                "0e8a2f4c-1b2d-4e5f-8a9b-0c1d2e3f4a5b",
                "0E8A2F4C1B2D4E5F8A9B0C1D2E3F4A5B",
                "0e8a2f4c1b2d4e5f8a9b0c1d2e3f4a5b",
            ]
        );
        assert_eq!(
            spellings("Zoë\"Q@Example.com", 6),
            [
                "Zoë\"Q@Example.com",
                "Zoë\\\"Q@Example.com",
                "Zo\\u00eb\\\"Q@Example.com",
                "zoë\"q@example.com",
                "ZOË\"Q@EXAMPLE.COM",
            ]
        );
        assert_eq!(spellings("tab\there", 6), ["tab\there", "tab\\there"]);
        assert_eq!(spellings("12345678", 6), ["12345678"]);
        assert_eq!(spellings("a@1234", 6), ["a@1234", "A@1234"]);
        assert_eq!(spellings("1@2345", 6), ["1@2345"]);
        assert!(spellings("Bob", 6).is_empty());
        // four characters, eight bytes: shorter than 6 characters, its ASCII escape is not
        assert_eq!(spellings("éééé", 6), ["\\u00e9\\u00e9\\u00e9\\u00e9"]);
        assert_eq!(spellings("éééééé", 6)[0], "éééééé");
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

    /// Every inserted spelling is found; others rarely are (the documented rate, with room).
    #[test]
    fn the_blocked_filter_has_no_false_negatives_and_few_false_positives() {
        let n = 200_000;
        let mut f = KeyedFilter::with_capacity(n);
        for i in 0..n {
            f.insert(&format!("raw-{i}"));
        }
        assert!((0..n).all(|i| f.may_contain(&format!("raw-{i}"))));
        let false_positives = (0..1_000_000)
            .filter(|i| f.may_contain(&format!("masked-{i}")))
            .count();
        assert!(false_positives < 200, "{false_positives} in 1,000,000");
    }
}
