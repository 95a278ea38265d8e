//! The keyed hashes of `hash`: integers permuted within their sign, uuids from the keyed
//! hash, text of the same length and shape.

use std::borrow::Cow;

use super::TransformKey;

/// A keyed permutation of the `bits`-bit signed integers keeping the sign: non-negative
/// values map onto `[0, 2^(bits-1))`, negative ones onto `[-2^(bits-1), 0)`.
pub(super) fn hash_int(key: &TransformKey, n: i64, bits: u32) -> i64 {
    let magnitude_bits = bits - 1;
    if n >= 0 {
        key.permute(n as u64, magnitude_bits) as i64
    } else {
        // -1 → 0, -2 → 1, …, the most negative value → the largest magnitude.
        let m = (-(n + 1)) as u64;
        -(key.permute(m, magnitude_bits) as i64) - 1
    }
}

/// A uuid from the keyed hash of the value's canonical (lowercase) text, version 4 bits set.
pub(super) fn hash_uuid(key: &TransformKey, value: &str) -> String {
    // PostgreSQL writes uuids in lowercase, so the copy is only for text from elsewhere.
    let canonical = if value.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(value.to_ascii_lowercase())
    } else {
        Cow::Borrowed(value)
    };
    let t = key.tag(b"uuid", canonical.as_bytes());
    let mut b: [u8; 16] = t[..16].try_into().expect("16 bytes");
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let mut text = *b"00000000-0000-0000-0000-000000000000";
    for (bytes, at) in [(0..4, 0), (4..6, 9), (6..8, 14), (8..10, 19), (10..16, 24)] {
        let digits = 2 * bytes.len();
        hex::encode_to_slice(&b[bytes], &mut text[at..at + digits]).expect("two digits a byte");
    }
    String::from_utf8(text.to_vec()).expect("hex digits and dashes")
}

/// Text of the same length and shape; an email (`local@domain`) keeps that shape, its domain
/// hashed on its own (its last label, the TLD, kept).
pub(super) fn hash_text(key: &TransformKey, value: &str) -> String {
    if let Some((local, domain)) = value.split_once('@')
        && !local.is_empty()
        && !domain.is_empty()
        && !domain.contains('@')
    {
        let local = shape(
            local,
            &key.stream(b"email-local", value.as_bytes(), local.len()),
        );
        let (labels, tld) = match domain.rsplit_once('.') {
            Some((labels, tld)) if !labels.is_empty() => (labels, Some(tld)),
            _ => (domain, None),
        };
        let labels = shape(
            labels,
            &key.stream(
                b"email-domain",
                domain.to_ascii_lowercase().as_bytes(),
                labels.len(),
            ),
        );
        return match tld {
            Some(tld) => format!("{local}@{labels}.{tld}"),
            None => format!("{local}@{labels}"),
        };
    }
    shape(value, &key.stream(b"text", value.as_bytes(), value.len()))
}

/// Replaces each letter by a letter of the same case and each digit by a digit, chosen by
/// `bytes` (one per character); other characters stay (so separators keep the shape).
fn shape(value: &str, bytes: &[u8]) -> String {
    let mut out = String::with_capacity(value.len());
    for (c, b) in value
        .chars()
        .zip(bytes.iter().copied().chain(std::iter::repeat(0)))
    {
        out.push(if c.is_ascii_uppercase() {
            (b'A' + b % 26) as char
        } else if c.is_ascii_digit() {
            (b'0' + b % 10) as char
        } else if c.is_alphabetic() {
            (b'a' + b % 26) as char
        } else {
            c
        });
    }
    out
}
