//! The fast path of [`super::CopyEncoder`]: a row in the compact form archives hold (JSON with
//! no control characters, keys without escapes) is cut into its top-level fields in one pass,
//! without parsing the nested values a column takes whole. Strings, numbers and literals are
//! checked against JSON's grammar here; a nested object or array is only matched bracket for
//! bracket, and is checked where its text is used: by PostgreSQL's `json`/`jsonb` input, by
//! the array encoder's parser, or by serde_json for any other column and for fields that are
//! no column. A row this path does not take (`None`) goes to serde_json, which also names
//! what is wrong with it.

/// Whether `row` has a byte COPY text must escape (`\` or a control character) and whether
/// it has a control character at all (JSON allows them raw only as whitespace).
pub(super) fn specials(row: &[u8]) -> (bool, bool) {
    // Branch-free folds (vectorised): most rows have neither.
    let control = row.iter().fold(0u8, |any, &b| any | u8::from(b < 0x20));
    let backslash = row.iter().fold(0u8, |any, &b| any | u8::from(b == b'\\'));
    (control | backslash != 0, control != 0)
}

/// Calls `field(key, start, end)` for each top-level field of the object `row` (the value's
/// byte range); `field` says whether the key names a column. `None` when the row is not in
/// the form this path reads, or not valid where it looked; the caller then parses it fully.
pub(super) fn fields(row: &str, mut field: impl FnMut(&str, usize, usize) -> bool) -> Option<()> {
    let bytes = row.as_bytes();
    let mut entry = first_entry(bytes, b'{', b'}')?;
    while let Entry::At(at) = entry {
        if bytes.get(at) != Some(&b'"') {
            return None;
        }
        let key_end = quote_or_backslash(bytes, at + 1)?;
        if bytes[key_end] != b'"' {
            return None; // an escaped key
        }
        let key = row.get(at + 1..key_end)?;
        let colon = skip_spaces(bytes, key_end + 1);
        if bytes.get(colon) != Some(&b':') {
            return None;
        }
        let start = skip_spaces(bytes, colon + 1);
        let stop = value_end(bytes, start)?;
        if !field(key, start, stop) && matches!(bytes[start], b'{' | b'[') {
            // Not a column, so nothing else reads it: checked here.
            serde_json::from_str::<serde::de::IgnoredAny>(&row[start..stop]).ok()?;
        }
        entry = next_entry(bytes, stop, b'}')?;
    }
    Some(())
}

/// Where a container's walk stands: at the start of an entry, or past its closing bracket
/// (with nothing but spaces after it).
enum Entry {
    At(usize),
    Closed,
}

/// The first entry of the container `bytes` holds, opened by `open` and closed by `close`.
fn first_entry(bytes: &[u8], open: u8, close: u8) -> Option<Entry> {
    let at = skip_spaces(bytes, 0);
    if bytes.get(at) != Some(&open) {
        return None;
    }
    let at = skip_spaces(bytes, at + 1);
    if bytes.get(at) == Some(&close) {
        return end(bytes, at + 1).map(|()| Entry::Closed);
    }
    Some(Entry::At(at))
}

/// The entry after the value ending at `stop`: past a comma, or the container closed.
fn next_entry(bytes: &[u8], stop: usize, close: u8) -> Option<Entry> {
    let at = skip_spaces(bytes, stop);
    match *bytes.get(at)? {
        b',' => Some(Entry::At(skip_spaces(bytes, at + 1))),
        c if c == close => end(bytes, at + 1).map(|()| Entry::Closed),
        _ => None,
    }
}

fn end(bytes: &[u8], at: usize) -> Option<()> {
    (skip_spaces(bytes, at) == bytes.len()).then_some(())
}

fn skip_spaces(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at) == Some(&b' ') {
        at += 1;
    }
    at
}

/// Where the value starting at `at` ends.
fn value_end(bytes: &[u8], at: usize) -> Option<usize> {
    match *bytes.get(at)? {
        b'"' => string_end(bytes, at),
        b'{' | b'[' => nested_end(bytes, at),
        b't' => literal_end(bytes, at, b"true"),
        b'f' => literal_end(bytes, at, b"false"),
        b'n' => literal_end(bytes, at, b"null"),
        b'-' | b'0'..=b'9' => number_end(bytes, at),
        _ => None,
    }
}

fn literal_end(bytes: &[u8], at: usize, literal: &[u8]) -> Option<usize> {
    bytes[at..]
        .starts_with(literal)
        .then_some(at + literal.len())
}

/// The end of the string whose opening quote is at `at`, its escapes checked.
fn string_end(bytes: &[u8], at: usize) -> Option<usize> {
    let mut i = at + 1;
    loop {
        i = quote_or_backslash(bytes, i)?;
        if bytes[i] == b'"' {
            return Some(i + 1);
        }
        i += match *bytes.get(i + 1)? {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => 2,
            b'u' if bytes.get(i + 2..i + 6)?.iter().all(u8::is_ascii_hexdigit) => 6,
            _ => return None,
        };
    }
}

/// The first `"` or `\` at or after `from`. Strings in rows are mostly short: eight bytes are
/// looked at a time in a word (the lowest flagged byte is exact) before a vectorised search.
fn quote_or_backslash(bytes: &[u8], from: usize) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    let zero_byte = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
    let mut i = from;
    for _ in 0..4 {
        let Some(word) = bytes.get(i..i + 8) else {
            break;
        };
        let word = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        let found = zero_byte(word ^ (ONES * u64::from(b'"')))
            | zero_byte(word ^ (ONES * u64::from(b'\\')));
        if found != 0 {
            return Some(i + (found.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    memchr::memchr2(b'"', b'\\', bytes.get(i..)?).map(|k| i + k)
}

/// The end of the object or array opening at `at`: brackets matched (64 deep at most, one bit
/// per level saying which), strings skipped.
fn nested_end(bytes: &[u8], at: usize) -> Option<usize> {
    let (mut objects, mut depth) = (0u64, 0u32);
    let mut i = at;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i = string_end(bytes, i)?;
                continue;
            }
            open @ (b'{' | b'[') => {
                if depth == 64 {
                    return None;
                }
                objects = (objects << 1) | u64::from(open == b'{');
                depth += 1;
            }
            close @ (b'}' | b']') => {
                if depth == 0 || (objects & 1 == 1) != (close == b'}') {
                    return None;
                }
                objects >>= 1;
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// An element of a flat JSON array.
pub(super) enum Item<'a> {
    /// A string without escapes: its content.
    Text(&'a str),
    /// A number, `true` or `false`: its JSON text.
    Bare(&'a str),
    Null,
}

/// Calls `item` for each element of the JSON array `v` when every element is a string without
/// escapes, a number, a boolean or null; `None` (after any number of calls) otherwise.
pub(super) fn flat_array(v: &str, mut item: impl FnMut(Item<'_>)) -> Option<()> {
    let bytes = v.as_bytes();
    let mut entry = first_entry(bytes, b'[', b']')?;
    while let Entry::At(at) = entry {
        let stop = match *bytes.get(at)? {
            b'"' => {
                let stop = string_end(bytes, at)?;
                let text = v.get(at + 1..stop - 1)?;
                if text.contains('\\') {
                    return None;
                }
                item(Item::Text(text));
                stop
            }
            b'n' => {
                let stop = literal_end(bytes, at, b"null")?;
                item(Item::Null);
                stop
            }
            b'{' | b'[' => return None,
            _ => {
                let stop = value_end(bytes, at)?;
                item(Item::Bare(&v[at..stop]));
                stop
            }
        };
        entry = next_entry(bytes, stop, b']')?;
    }
    Some(())
}

/// JSON's number: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
fn number_end(bytes: &[u8], at: usize) -> Option<usize> {
    let digits = |from: usize| {
        from + bytes[from..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let mut i = at + usize::from(bytes[at] == b'-');
    match bytes.get(i)? {
        b'0' => i += 1,
        b'1'..=b'9' => i = digits(i),
        _ => return None,
    }
    if bytes.get(i) == Some(&b'.') {
        let after = digits(i + 1);
        if after == i + 1 {
            return None;
        }
        i = after;
    }
    if matches!(bytes.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(bytes.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let after = digits(i);
        if after == i {
            return None;
        }
        i = after;
    }
    Some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans(row: &str) -> Option<Vec<(String, String)>> {
        let mut found = Vec::new();
        fields(row, |key, start, end| {
            found.push((key.to_string(), row[start..end].to_string()));
            true
        })?;
        Some(found)
    }

    /// The fields of every row this path takes are the ones serde_json finds.
    #[test]
    fn the_fields_are_serde_jsons() {
        for row in [
            r#"{}"#,
            r#" { } "#,
            r#"{"a":1,"b":-0.5e+10,"c":"x\"y\\z\u00e9","d":true,"e":false,"f":null}"#,
            r#"{"p":{"n":1,"s":"}]\"","nested":{"ok":[1,{"x":"["}]}},"t":["a1","b1"]}"#,
            r#"{ "a" : 1 , "b" : [ ] }"#,
            r#"{"a":1,"a":2}"#,
            r#"{"big":9007199254740993,"neg":-0,"exp":1E5,"frac":0.01}"#,
        ] {
            let ours = spans(row).unwrap_or_else(|| panic!("not taken: {row}"));
            let mut de = serde_json::Deserializer::from_str(row);
            let theirs: Vec<(String, String)> = serde::Deserialize::deserialize(&mut de)
                .map(|Pairs(pairs)| pairs)
                .unwrap()
                .into_iter()
                .map(|(k, v)| (k, v.get().to_string()))
                .collect();
            assert_eq!(ours, theirs, "{row}");
        }
    }

    /// Rows this path leaves to serde_json: not its form, or not JSON.
    #[test]
    fn other_rows_go_to_the_full_parser() {
        for row in [
            "{\"a\":1,\n\"b\":2}",
            r#"{"\u0069d":1}"#,
            r#"{"a":1,}"#,
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":-}"#,
            r#"{"a":1e}"#,
            r#"{"a":tru}"#,
            r#"{"a":"x\q"}"#,
            r#"{"a":"\u12"}"#,
            r#"{"a":"open}"#,
            r#"{"a":{"b":1]}"#,
            r#"{"a":[1,2}"#,
            r#"{"a":1} x"#,
            r#"{"a" 1}"#,
            r#"[1]"#,
            r#"{"a":1"#,
        ] {
            assert!(spans(row).is_none(), "taken: {row}");
        }
        // A nested value that is no column is checked here.
        assert!(fields(r#"{"x":{"a":}}"#, |_, _, _| false).is_none());
        assert!(fields(r#"{"x":{"a":1}}"#, |_, _, _| false).is_some());
    }

    #[test]
    fn flat_arrays_are_read_and_others_left() {
        let items = |v: &str| {
            let mut got = Vec::new();
            flat_array(v, |i| {
                got.push(match i {
                    Item::Text(t) => format!("text {t}"),
                    Item::Bare(b) => format!("bare {b}"),
                    Item::Null => "null".into(),
                })
            })
            .map(|()| got)
        };
        assert_eq!(
            items(r#"["a1", 2 ,null,true,"{x}"]"#).unwrap(),
            ["text a1", "bare 2", "null", "bare true", "text {x}"]
        );
        assert_eq!(items("[]").unwrap(), Vec::<String>::new());
        for v in [
            r#"["a\"b"]"#,
            r#"[[1]]"#,
            r#"[{"a":1}]"#,
            r#"[1,]"#,
            r#"[1"#,
            r#"[01]"#,
            r#"[1] x"#,
        ] {
            assert!(items(v).is_none(), "read: {v}");
        }
    }

    /// The word-at-a-time search finds what a byte-by-byte one finds, wherever it is.
    #[test]
    fn quotes_and_backslashes_are_found_at_any_offset() {
        for len in 0..80 {
            for at in 0..=len {
                for mark in [b'"', b'\\'] {
                    let mut text = vec![b'a'; len];
                    // Bytes that differ from the marks by one bit or by a borrow.
                    for (i, b) in text.iter_mut().enumerate() {
                        *b = [b'a', b'#', b'!', 0xdc, b']', 0x80][i % 6];
                    }
                    if at < len {
                        text[at] = mark;
                    }
                    let want = text.iter().position(|&b| b == b'"' || b == b'\\');
                    assert_eq!(quote_or_backslash(&text, 0), want, "len {len} at {at}");
                }
            }
        }
    }

    #[test]
    fn specials_say_what_to_escape() {
        assert_eq!(specials(br#"{"a":"b"}"#), (false, false));
        assert_eq!(specials(br#"{"a":"b\n"}"#), (true, false));
        assert_eq!(specials(b"{\"a\":\t1}"), (true, true));
    }

    /// The object's fields in order, duplicates kept.
    struct Pairs(Vec<(String, Box<serde_json::value::RawValue>)>);

    impl<'de> serde::Deserialize<'de> for Pairs {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = Pairs;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<Pairs, A::Error> {
                    let mut pairs = Vec::new();
                    while let Some(pair) = map.next_entry()? {
                        pairs.push(pair);
                    }
                    Ok(Pairs(pairs))
                }
            }
            d.deserialize_map(Visit)
        }
    }
}
