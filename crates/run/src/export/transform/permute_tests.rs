use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

fn key() -> TransformKey {
    TransformKey::from_bytes(b"0123456789abcdef-permute-key", "test").unwrap()
}

fn other_key() -> TransformKey {
    TransformKey::from_bytes(b"fedcba9876543210-another-key", "test").unwrap()
}

fn text(v: &str) -> String {
    permute_text(&key(), v, Direction::Forward)
}

/// A DNS host name: labels of letters, digits and inner hyphens, 1-63 characters.
fn valid_domain(d: &str) -> bool {
    d.len() <= 253
        && d.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

fn canonical_uuid(u: &str) -> bool {
    u.len() == 36
        && u.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_digit() || ('a'..='f').contains(&c),
        })
}

/// Characters a permuted text keeps in place, and the class of the others.
fn skeleton(v: &str) -> String {
    v.chars()
        .map(|c| {
            if c.is_ascii_uppercase() {
                'A'
            } else if c.is_ascii_lowercase() {
                'a'
            } else if c.is_ascii_digit() {
                '0'
            } else {
                c
            }
        })
        .collect()
}

fn email() -> impl Strategy<Value = String> {
    (
        "[a-zA-Z0-9._+-]{1,12}",
        prop::collection::vec("[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", 1..3),
        "[a-z]{2,6}",
    )
        .prop_map(|(local, labels, tld)| format!("{local}@{}.{tld}", labels.join(".")))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Distinct inputs give distinct outputs, each of the input's skeleton, and the key
    /// reverses it.
    #[test]
    fn text_is_a_bijection_keeping_the_skeleton(
        values in prop::collection::btree_set("[a-zA-Z0-9 @._é-]{0,12}", 1..40)
    ) {
        let mut outputs = BTreeSet::new();
        for v in &values {
            let out = text(v);
            prop_assert_eq!(skeleton(&out), skeleton(v));
            prop_assert_eq!(out.chars().count(), v.chars().count());
            prop_assert_eq!(permute_text(&key(), &out, Direction::Inverse), v.clone());
            outputs.insert(out);
        }
        prop_assert_eq!(outputs.len(), values.len());
    }

    /// Values equal but for case stay so, and values different but for case stay different
    /// but for case: a `citext` UNIQUE column stays unique.
    #[test]
    fn case_folded_values_stay_distinct(
        values in prop::collection::btree_set("[a-cA-C0-1@.]{1,5}", 1..60)
    ) {
        let mut folded: BTreeMap<String, String> = BTreeMap::new();
        for v in &values {
            let out = text(v).to_lowercase();
            if let Some(seen) = folded.insert(out, v.to_lowercase()) {
                prop_assert_eq!(seen, v.to_lowercase());
            }
        }
    }

    /// Numeric strings stay numeric strings of the same length, and unique.
    #[test]
    fn digits_stay_digits(values in prop::collection::btree_set("[0-9]{1,18}", 1..60)) {
        let outputs: BTreeSet<String> = values.iter().map(|v| text(v)).collect();
        prop_assert_eq!(outputs.len(), values.len());
        for (v, out) in values.iter().zip(values.iter().map(|v| text(v))) {
            prop_assert_eq!(out.len(), v.len());
            prop_assert!(out.bytes().all(|b| b.is_ascii_digit()), "{out}");
        }
    }

    /// An email keeps one `@` and a valid domain (its TLD), and addresses stay unique.
    #[test]
    fn emails_stay_valid_and_unique(values in prop::collection::btree_set(email(), 1..60)) {
        let mut outputs = BTreeSet::new();
        for v in &values {
            let out = text(v);
            prop_assert_eq!(out.matches('@').count(), 1);
            let (local, domain) = out.split_once('@').unwrap();
            prop_assert!(!local.is_empty());
            prop_assert!(valid_domain(domain), "{domain} from {v}");
            prop_assert_eq!(domain.rsplit('.').next(), v.rsplit('.').next());
            prop_assert_eq!(permute_text(&key(), &out, Direction::Inverse), v.clone());
            outputs.insert(out.to_lowercase());
        }
        prop_assert_eq!(outputs.len(), values.len());
    }

    /// Uuids stay canonical uuids, unique, and the key reverses them.
    #[test]
    fn uuids_stay_uuids(values in prop::collection::btree_set(any::<u128>(), 1..60)) {
        let mut outputs = BTreeSet::new();
        for v in &values {
            let hex = format!("{v:032x}");
            let text = format!(
                "{}-{}-{}-{}-{}",
                &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..]
            );
            let out = permute_uuid(&key(), &text.to_uppercase(), Direction::Forward).unwrap();
            prop_assert!(canonical_uuid(&out), "{out}");
            prop_assert_eq!(permute_uuid(&key(), &out, Direction::Inverse), Some(text));
            outputs.insert(out);
        }
        prop_assert_eq!(outputs.len(), values.len());
    }
}

/// Every value of a small domain (all 3-character lowercase strings): a permutation of it.
#[test]
fn a_whole_small_domain_is_permuted() {
    let k = key();
    let mut outputs = BTreeSet::new();
    for a in b'a'..=b'z' {
        for b in b'a'..=b'z' {
            for c in b'0'..=b'9' {
                let v = String::from_utf8(vec![a, b, c]).unwrap();
                outputs.insert(permute_text(&k, &v, Direction::Forward));
            }
        }
    }
    assert_eq!(outputs.len(), 26 * 26 * 10);
    assert!(outputs.iter().all(|o| skeleton(o) == "aa0"));
}

#[test]
fn one_domain_stays_one_domain_and_the_key_decides() {
    let a = text("alice@acme-corp.com");
    let b = text("bob@ACME-corp.com");
    let domain = |e: &str| e.split_once('@').unwrap().1.to_lowercase();
    assert_eq!(domain(&a), domain(&b));
    assert!(a.ends_with(".com") && !a.contains("acme"), "{a}");
    // Deterministic under one key, different under another.
    assert_eq!(text("alice@acme-corp.com"), a);
    assert_ne!(
        permute_text(&other_key(), "alice@acme-corp.com", Direction::Forward),
        a
    );
    // Not the identity, and not the hash.
    assert_ne!(text("customer-000123"), "customer-000123");
    assert_ne!(
        text("customer-000123"),
        super::super::hash::hash_text(&key(), "customer-000123")
    );
}

#[test]
fn a_value_not_a_uuid_is_refused() {
    let mut out = Vec::new();
    assert_eq!(
        write(&key(), HashFormat::Uuid, "not-a-uuid", &mut out),
        Err("a value is not a uuid")
    );
    assert!(
        permute_uuid(
            &key(),
            "0123456789abcdef0123456789abcdeg",
            Direction::Forward
        )
        .is_none()
    );
}
