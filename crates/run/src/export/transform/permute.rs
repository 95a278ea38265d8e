//! `permute`: a keyed, format-preserving permutation (unique in, unique out; reversible only
//! with the key), for keys a `hash` could collide on (text, emails, uuids, numeric strings).
//!
//! The construction: a value's characters are split into those permuted (ASCII letters,
//! radix 26, case-folded; ASCII digits, radix 10; a uuid's 32 hex digits, radix 16) and those
//! kept (everything else: separators, `@`, spaces, non-ASCII). The permuted ones form a
//! mixed-radix number, and a 10-round Feistel network (as FF1's) over its two halves adds,
//! digit by digit modulo each digit's radix, a keyed pseudo-random function (HMAC-SHA-256 of
//! the round, the tweak and the other half) to one half per round. Each round is invertible
//! with the key, so the whole is a bijection on the values of one *skeleton* (the kept
//! characters and which positions are letters or digits), and the output keeps that skeleton:
//! two values of different skeletons stay different, two of one skeleton are permuted apart.
//! The tweak is the skeleton (lowercased), so the letters' case is restored after permuting
//! the case-folded value: values equal but for case (`citext`, emails) stay equal but for case.
//!
//! An email (`local@domain`, one `@`) permutes its domain on its own (one domain stays one
//! domain, its last label kept, so it stays a valid domain name) and its local part under a
//! tweak holding the domain: distinct addresses stay distinct.

use std::sync::Arc;

use larch_archive::model::ColumnDefinition;
use larch_postgres::write_string;

use super::{HashFormat, KEY_ENV, TransformKey, hash::hash_int};

/// The algorithm's version, recorded in the manifest (`transform.permute`).
pub const PERMUTE_ALGORITHM: &str = "larch-permute-1";

/// Rounds of the Feistel network (FF1's number).
const ROUNDS: u8 = 10;

/// Which way the network runs: masking, or (with the key) unmasking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Direction {
    Forward,
    /// Unmasking with the key: what the property tests prove; larch itself never unmasks.
    #[cfg_attr(not(test), allow(dead_code))]
    Inverse,
}

/// The format `permute` keeps for column `c`, or why it cannot.
pub(super) fn format_of(c: &ColumnDefinition, sql_type: &str) -> Result<HashFormat, String> {
    HashFormat::of(c).ok_or_else(|| {
        format!(
            "permute cannot keep the type {sql_type} (it permutes text, varchar, char, name, \
             citext, uuid, smallint, integer and bigint): use null, redact or drop"
        )
    })
}

/// The key `permute` needs, or the error naming where it comes from.
pub(super) fn key_for(key: Option<&Arc<TransformKey>>) -> Result<&Arc<TransformKey>, String> {
    key.ok_or_else(|| {
        format!(
            "permute needs a key: --transform-key-file FILE or ${KEY_ENV} (on Kubernetes \
             spec.transform.keySecretRef)"
        )
    })
}

/// Appends the JSON of the permuted value whose text is `text`.
pub(super) fn write(
    key: &TransformKey,
    format: HashFormat,
    text: &str,
    out: &mut Vec<u8>,
) -> Result<(), &'static str> {
    match format {
        // Integers: the `hash` permutation, already a bijection of the type's range.
        HashFormat::Int(bits) => {
            let n: i64 = text.parse().map_err(|_| "a value is not an integer")?;
            out.extend_from_slice(hash_int(key, n, bits).to_string().as_bytes());
        }
        HashFormat::Uuid => {
            let uuid =
                permute_uuid(key, text, Direction::Forward).ok_or("a value is not a uuid")?;
            out.push(b'"');
            out.extend_from_slice(uuid.as_bytes());
            out.push(b'"');
        }
        HashFormat::Text => write_string(&permute_text(key, text, Direction::Forward), out),
    }
    Ok(())
}

/// A uuid (any case, dashes optional) permuted as 32 hex digits; written canonically
/// (lowercase, 8-4-4-4-12). Every 128-bit value is a uuid, so every output parses as one.
pub(super) fn permute_uuid(key: &TransformKey, text: &str, direction: Direction) -> Option<String> {
    let mut digits = Vec::with_capacity(32);
    for c in text.chars().filter(|c| *c != '-') {
        digits.push(c.to_digit(16)? as u8);
    }
    if digits.len() != 32 {
        return None;
    }
    feistel(key, b"uuid", &[16; 32], &mut digits, direction);
    let mut out = String::with_capacity(36);
    for (i, d) in digits.iter().enumerate() {
        if matches!(i, 8 | 12 | 16 | 20) {
            out.push('-');
        }
        out.push(char::from_digit(u32::from(*d), 16).expect("a hex digit"));
    }
    Some(out)
}

/// Text permuted within its skeleton; an email per part (see the module's documentation).
pub(super) fn permute_text(key: &TransformKey, value: &str, direction: Direction) -> String {
    let Some((local, domain)) = email_parts(value) else {
        return permute_chars(key, b"text", "", value, direction);
    };
    // The tweak of the local part is the masked domain's lowercase form, which both
    // directions know: the output's domain when unmasking, the input's masked when masking.
    let (domain_out, masked_domain) = match direction {
        Direction::Forward => {
            let d = permute_domain(key, domain, direction);
            (d.clone(), d)
        }
        Direction::Inverse => (permute_domain(key, domain, direction), domain.to_string()),
    };
    let tweak = masked_domain.to_lowercase();
    let local_out = permute_chars(key, b"email-local", &tweak, local, direction);
    format!("{local_out}@{domain_out}")
}

/// `local@domain` when the value has exactly one `@` with text on both sides.
fn email_parts(value: &str) -> Option<(&str, &str)> {
    let (local, domain) = value.split_once('@')?;
    (!local.is_empty() && !domain.is_empty() && !domain.contains('@')).then_some((local, domain))
}

/// The domain's labels permuted, its last label (the TLD) kept: letters stay letters, digits
/// digits, dots and hyphens in place, so a valid domain name stays one.
fn permute_domain(key: &TransformKey, domain: &str, direction: Direction) -> String {
    match domain.rsplit_once('.') {
        Some((labels, tld)) if !labels.is_empty() => {
            let tweak = tld.to_lowercase();
            let labels = permute_chars(key, b"email-domain", &tweak, labels, direction);
            format!("{labels}.{tld}")
        }
        _ => permute_chars(key, b"email-domain", "", domain, direction),
    }
}

/// The ASCII letters (case-folded, case restored) and digits of `value` permuted, every other
/// character kept; `domain` and `tweak` separate the uses.
fn permute_chars(
    key: &TransformKey,
    domain: &[u8],
    tweak: &str,
    value: &str,
    direction: Direction,
) -> String {
    let chars: Vec<char> = value.chars().collect();
    let mut radix = Vec::with_capacity(chars.len());
    let mut digits = Vec::with_capacity(chars.len());
    // The tweak: the use, its tweak, and the skeleton (kept characters lowercased, `a` for a
    // letter, `0` for a digit), each length-prefixed.
    let mut skeleton = String::with_capacity(value.len());
    for c in &chars {
        if c.is_ascii_alphabetic() {
            radix.push(26);
            digits.push(c.to_ascii_lowercase() as u8 - b'a');
            skeleton.push('a');
        } else if c.is_ascii_digit() {
            radix.push(10);
            digits.push(*c as u8 - b'0');
            skeleton.push('0');
        } else {
            skeleton.extend(c.to_lowercase());
        }
    }
    if digits.is_empty() {
        return value.to_string();
    }
    let mut full_tweak = Vec::with_capacity(domain.len() + tweak.len() + skeleton.len() + 16);
    for part in [domain, tweak.as_bytes(), skeleton.as_bytes()] {
        full_tweak.extend_from_slice(&(part.len() as u32).to_be_bytes());
        full_tweak.extend_from_slice(part);
    }
    feistel(key, &full_tweak, &radix, &mut digits, direction);
    let mut next = digits.into_iter();
    chars
        .into_iter()
        .map(|c| {
            if c.is_ascii_alphabetic() {
                let letter = (b'a' + next.next().expect("one digit a letter")) as char;
                if c.is_ascii_uppercase() {
                    letter.to_ascii_uppercase()
                } else {
                    letter
                }
            } else if c.is_ascii_digit() {
                (b'0' + next.next().expect("one digit a digit")) as char
            } else {
                c
            }
        })
        .collect()
}

/// The Feistel network over `digits` (digit `i` in radix `radix[i]`): the first half `a`, the
/// second `b`; even rounds add F(b) to `a`, odd rounds F(a) to `b`, digit-wise modulo the
/// radix. [`Direction::Inverse`] runs the rounds backwards, subtracting.
fn feistel(
    key: &TransformKey,
    tweak: &[u8],
    radix: &[u8],
    digits: &mut [u8],
    direction: Direction,
) {
    let split = digits.len() / 2;
    let rounds: Vec<u8> = match direction {
        Direction::Forward => (0..ROUNDS).collect(),
        Direction::Inverse => (0..ROUNDS).rev().collect(),
    };
    for round in rounds {
        let (a, b) = digits.split_at_mut(split);
        let (a_radix, b_radix) = radix.split_at(split);
        let (target, target_radix, other) = if round % 2 == 0 {
            (a, a_radix, &*b)
        } else {
            (b, b_radix, &*a)
        };
        if target.is_empty() {
            continue;
        }
        let f = round_function(key, tweak, round, other, target.len());
        for ((d, r), pair) in target.iter_mut().zip(target_radix).zip(f.chunks_exact(2)) {
            let r = u16::from(*r);
            // Two bytes a digit: the bias of the modulo stays below 2^-10.
            let add = (u16::from_be_bytes([pair[0], pair[1]]) % r) as u8;
            *d = match direction {
                Direction::Forward => ((u16::from(*d) + u16::from(add)) % r) as u8,
                Direction::Inverse => ((u16::from(*d) + r - u16::from(add)) % r) as u8,
            };
        }
    }
}

/// Two pseudo-random bytes per digit of the half updated: the keyed stream of the round, the
/// tweak and the other half.
fn round_function(key: &TransformKey, tweak: &[u8], round: u8, other: &[u8], n: usize) -> Vec<u8> {
    let mut input = Vec::with_capacity(tweak.len() + other.len() + 1);
    input.extend_from_slice(tweak);
    input.extend_from_slice(other);
    let domain = [b"larch permute v1 round ".as_slice(), &[round]].concat();
    key.stream(&domain, &input, 2 * n)
}

#[cfg(test)]
#[path = "permute_tests.rs"]
mod tests;
