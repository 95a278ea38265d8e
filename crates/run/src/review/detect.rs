//! Which columns look sensitive: by their name (its words: `email`, `first_name`, `zip`...) and
//! by a sample of their values (emails, phone numbers, IBANs with their mod-97 check, card
//! numbers with Luhn's check and a card network's prefix, IP addresses, JWTs). Pure: the
//! caller reads the sample.

use std::net::{Ipv4Addr, Ipv6Addr};

/// What a sensitive column holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Email,
    Phone,
    FirstName,
    LastName,
    FullName,
    StreetAddress,
    City,
    PostalCode,
    NationalId,
    Iban,
    Card,
    IpAddress,
    BirthDate,
    Secret,
}

impl Kind {
    /// How the kind reads in a reason.
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Email => "email addresses",
            Kind::Phone => "phone numbers",
            Kind::FirstName => "first names",
            Kind::LastName => "last names",
            Kind::FullName => "names",
            Kind::StreetAddress => "street addresses",
            Kind::City => "cities",
            Kind::PostalCode => "postal codes",
            Kind::NationalId => "national identity numbers",
            Kind::Iban => "IBANs",
            Kind::Card => "payment card numbers",
            Kind::IpAddress => "IP addresses",
            Kind::BirthDate => "birth dates",
            Kind::Secret => "secrets (tokens, passwords, keys)",
        }
    }
}

/// Name words and the kind they mark. A name matches when one of its words (split at `_`,
/// `-`, digits and camelCase) is one of these, or two adjacent words are (`first name`).
const NAME_WORDS: &[(&[&str], Kind)] = &[
    (&["email", "mail", "emailaddress"], Kind::Email),
    (
        &["phone", "mobile", "msisdn", "fax", "telephone", "tel"],
        Kind::Phone,
    ),
    (&["firstname", "givenname", "forename"], Kind::FirstName),
    (&["first", "given"], Kind::FirstName),
    (&["lastname", "surname", "familyname"], Kind::LastName),
    (&["last", "family"], Kind::LastName),
    (
        &["name", "fullname", "username", "displayname"],
        Kind::FullName,
    ),
    (&["address", "street", "addr"], Kind::StreetAddress),
    (&["city", "town"], Kind::City),
    (
        &["zip", "zipcode", "postcode", "postal", "postalcode"],
        Kind::PostalCode,
    ),
    (
        &["ssn", "nino", "passport", "nationalid", "taxid", "tin"],
        Kind::NationalId,
    ),
    (&["iban", "bic", "swift"], Kind::Iban),
    (
        &["card", "pan", "cc", "ccnumber", "creditcard", "cvv", "cvc"],
        Kind::Card,
    ),
    (&["ip", "ipaddress", "ipv4", "ipv6"], Kind::IpAddress),
    (
        &["dob", "birth", "birthday", "birthdate", "born"],
        Kind::BirthDate,
    ),
    (
        &[
            "token", "secret", "password", "passwd", "pwd", "apikey", "salt", "otp",
        ],
        Kind::Secret,
    ),
];

/// Words that, next to a sensitive word, say the column is about it rather than holding it:
/// `email_verified`, `ip_count`, `name_id`, `phone_type`, `card_brand`.
const ABOUT_WORDS: &[&str] = &[
    "verified",
    "confirmed",
    "count",
    "id",
    "ids",
    "type",
    "kind",
    "status",
    "enabled",
    "valid",
    "brand",
    "length",
    "len",
    "at",
    "on",
    "sent",
    "opt",
    "optin",
    "optout",
    "flag",
    "is",
    "has",
    "num",
    "number_of",
    "format",
    "version",
    "hash",
    "hashed",
    "expires",
    "expiry",
    "changed",
    "updated",
    "created",
    "last4",
    "attempts",
    "policy",
    "strength",
    "reset",
];

/// The words of a column name, lower case: `billingEmail2` → `billing`, `email`.
pub fn words(name: &str) -> Vec<String> {
    let mut out = vec![];
    let mut word = String::new();
    let mut prev_lower = false;
    for c in name.chars() {
        if !c.is_alphabetic() {
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            prev_lower = false;
            continue;
        }
        if c.is_uppercase() && prev_lower && !word.is_empty() {
            out.push(std::mem::take(&mut word));
        }
        prev_lower = c.is_lowercase();
        word.extend(c.to_lowercase());
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// The kind a column's name says it holds, if any. A name whose last word says it is about
/// the sensitive value (`email_verified`, `ip_count`, `name_id`) holds none.
pub fn by_name(name: &str) -> Option<Kind> {
    let ws = words(name);
    let kind_of = |w: &str| {
        NAME_WORDS
            .iter()
            .find(|(names, _)| names.contains(&w))
            .map(|(_, k)| *k)
    };
    // The whole name first: `tax_id`, `first_name`, `e_mail`.
    if let Some(k) = kind_of(&ws.concat()) {
        return Some(k);
    }
    let last = ws.last()?;
    if ws.len() > 1 && ABOUT_WORDS.contains(&last.as_str()) {
        return None;
    }
    if ws.first().is_some_and(|w| w == "is" || w == "has") {
        return None;
    }
    // `first`/`last`/`given`/`family` mark a name only next to `name`.
    let weak = ["first", "given", "last", "family"];
    for (i, w) in ws.iter().enumerate() {
        if weak.contains(&w.as_str()) {
            if ws.get(i + 1).is_some_and(|n| n == "name") {
                return kind_of(w);
            }
            continue;
        }
        if let Some(k) = kind_of(w) {
            return Some(k);
        }
    }
    None
}

/// Counts of sampled values that look like each kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ValueEvidence {
    /// Non-NULL values read.
    pub values: usize,
    /// (kind, values that hold one).
    pub matches: Vec<(Kind, usize)>,
}

/// Kinds a value holding one of them is sensitive at once (a single email in a free-text
/// column is a leak); the weaker patterns (phone numbers, IPs) must make up most values.
const STRONG: [Kind; 3] = [Kind::Email, Kind::Iban, Kind::Card];

impl ValueEvidence {
    /// Adds one value (a text column's, NULLs left out).
    pub fn add(&mut self, value: &str) {
        self.values += 1;
        let mut found: Vec<Kind> = vec![];
        let whole = value.trim();
        if looks_like_phone(whole) {
            found.push(Kind::Phone);
        }
        if whole.parse::<Ipv4Addr>().is_ok() || whole.parse::<Ipv6Addr>().is_ok() {
            found.push(Kind::IpAddress);
        }
        // An IBAN printed in groups of four.
        if whole.contains(' ') && is_iban(whole) {
            found.push(Kind::Iban);
        }
        for token in tokens(value) {
            let kind = if is_email(token) {
                Kind::Email
            } else if is_jwt(token) {
                Kind::Secret
            } else if is_iban(token) {
                Kind::Iban
            } else {
                continue;
            };
            if !found.contains(&kind) {
                found.push(kind);
            }
        }
        if !found.contains(&Kind::Card) && card_numbers(value) {
            found.push(Kind::Card);
        }
        for k in found {
            match self.matches.iter_mut().find(|(m, _)| *m == k) {
                Some((_, n)) => *n += 1,
                None => self.matches.push((k, 1)),
            }
        }
    }

    /// The kind the values hold, with how many did: a strong kind (or a JWT) found at all,
    /// else a weak one in at least half the values.
    pub fn verdict(&self) -> Option<(Kind, usize)> {
        let strong = |k: Kind| STRONG.contains(&k) || k == Kind::Secret;
        let mut best = self
            .matches
            .iter()
            .filter(|(k, n)| strong(*k) || *n * 2 >= self.values.max(1))
            .copied()
            .collect::<Vec<_>>();
        best.sort_by_key(|(k, n)| (std::cmp::Reverse(*n), *k));
        best.into_iter().next()
    }
}

/// A value's tokens: split at white space and the punctuation around words in text.
fn tokens(value: &str) -> impl Iterator<Item = &str> {
    value
        .split(|c: char| {
            c.is_whitespace()
                || matches!(
                    c,
                    ',' | ';' | '(' | ')' | '<' | '>' | '"' | '\'' | '[' | ']'
                )
        })
        .map(|t| t.trim_end_matches(['.', ':', '!', '?']))
        .filter(|t| !t.is_empty())
}

/// `local@domain.tld`: a non-empty local part, a dotted domain of letters, digits and dashes.
fn is_email(t: &str) -> bool {
    let Some((local, domain)) = t.split_once('@') else {
        return false;
    };
    let local_ok = !local.is_empty()
        && local
            .chars()
            .all(|c| c.is_alphanumeric() || "._%+-".contains(c));
    let labels: Vec<&str> = domain.split('.').collect();
    let domain_ok = labels.len() >= 2
        && labels
            .iter()
            .all(|l| !l.is_empty() && l.chars().all(|c| c.is_alphanumeric() || c == '-'))
        && labels
            .last()
            .is_some_and(|tld| tld.len() >= 2 && tld.chars().all(char::is_alphabetic));
    local_ok && domain_ok
}

/// A JWT: three base64url segments, the header's JSON starting `{"` (`eyJ`).
fn is_jwt(t: &str) -> bool {
    let parts: Vec<&str> = t.split('.').collect();
    parts.len() == 3
        && parts[0].starts_with("eyJ")
        && parts[1].len() >= 4
        && parts.iter().all(|p| {
            p.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
}

/// An IBAN: two letters, two check digits, 11-30 letters or digits, and ISO 13616's mod-97
/// check (spaces allowed every four characters are left out by the caller's tokens).
fn is_iban(t: &str) -> bool {
    let s: Vec<char> = t.chars().filter(|c| *c != ' ').collect();
    if !(15..=34).contains(&s.len())
        || !s[..2].iter().all(char::is_ascii_uppercase)
        || !s[2..4].iter().all(char::is_ascii_digit)
        || !s[4..]
            .iter()
            .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase())
    {
        return false;
    }
    let mut rem: u32 = 0;
    for c in s[4..].iter().chain(&s[..4]) {
        let v = c.to_digit(36).expect("checked alphanumeric");
        rem = if v >= 10 {
            (rem * 100 + v) % 97
        } else {
            (rem * 10 + v) % 97
        };
    }
    rem == 1
}

/// A card number in `value`: 13-19 digits, alone or in groups separated by single spaces or
/// dashes, passing Luhn's check, with a card network's prefix (Visa 4, Mastercard 51-55 and
/// 2221-2720, Amex 34/37, Discover 6011/65, JCB 35, Diners 36/38).
fn card_numbers(value: &str) -> bool {
    let b = value.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() || (i > 0 && b[i - 1].is_ascii_alphanumeric()) {
            i += 1;
            continue;
        }
        let mut digits = String::new();
        let mut j = i;
        while j < b.len() {
            if b[j].is_ascii_digit() {
                digits.push(b[j] as char);
                j += 1;
            } else if matches!(b[j], b' ' | b'-')
                && b.get(j + 1).is_some_and(u8::is_ascii_digit)
                && digits.len() < 19
            {
                j += 1;
            } else {
                break;
            }
        }
        let bounded = b.get(j).is_none_or(|c| !c.is_ascii_alphanumeric());
        if bounded && (13..=19).contains(&digits.len()) && luhn(&digits) && card_prefix(&digits) {
            return true;
        }
        i = j.max(i + 1);
    }
    false
}

fn luhn(digits: &str) -> bool {
    let sum: u32 = digits
        .bytes()
        .rev()
        .enumerate()
        .map(|(i, d)| {
            let d = u32::from(d - b'0');
            if i % 2 == 1 {
                let x = d * 2;
                if x > 9 { x - 9 } else { x }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

fn card_prefix(d: &str) -> bool {
    let n = |k: usize| d[..k].parse::<u32>().unwrap_or(0);
    d.starts_with('4')
        || (51..=55).contains(&n(2))
        || (2221..=2720).contains(&n(4))
        || matches!(n(2), 34 | 35 | 36 | 37 | 38 | 65)
        || n(4) == 6011
}

/// A phone number: an optional `+`, 7-15 digits in groups separated by spaces, dashes, dots
/// or parentheses, with a `+` or a separator (a bare number is an id or an amount), and not a
/// date (`2024-01-05`) or a decimal.
fn looks_like_phone(v: &str) -> bool {
    let digits = v.chars().filter(char::is_ascii_digit).count();
    if !(7..=15).contains(&digits) || v.len() > 24 {
        return false;
    }
    let allowed = v
        .chars()
        .enumerate()
        .all(|(i, c)| c.is_ascii_digit() || " -.()".contains(c) || (c == '+' && i == 0));
    let separated = v.starts_with('+') || v.contains(['-', ' ', '(']);
    let date = v.len() == 10 && v.as_bytes()[4] == b'-' && v.as_bytes()[7] == b'-';
    let decimal = v.matches('.').count() == 1 && !v.contains([' ', '-', '(']);
    allowed
        && separated
        && !date
        && !decimal
        && v.chars()
            .next()
            .is_some_and(|c| c == '+' || c == '(' || c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_mark_kinds_and_traps_do_not() {
        for (name, kind) in [
            ("email", Kind::Email),
            ("billingEmail", Kind::Email),
            ("contact_phone", Kind::Phone),
            ("first_name", Kind::FirstName),
            ("lastName", Kind::LastName),
            ("surname", Kind::LastName),
            ("name", Kind::FullName),
            ("street", Kind::StreetAddress),
            ("home_address", Kind::StreetAddress),
            ("city", Kind::City),
            ("zip", Kind::PostalCode),
            ("postcode", Kind::PostalCode),
            ("ssn", Kind::NationalId),
            ("iban", Kind::Iban),
            ("card_number", Kind::Card),
            ("last_login_ip", Kind::IpAddress),
            ("dob", Kind::BirthDate),
            ("date_of_birth", Kind::BirthDate),
            ("api_token", Kind::Secret),
            ("password", Kind::Secret),
            ("client_secret", Kind::Secret),
            ("tax_id", Kind::NationalId),
            ("national_id", Kind::NationalId),
            ("e_mail", Kind::Email),
        ] {
            assert_eq!(by_name(name), Some(kind), "{name}");
        }
        for name in [
            "email_verified",
            "ip_count",
            "name_id",
            "id",
            "created_at",
            "first_seen",
            "last_updated",
            "shipping",
            "description",
            "is_email",
            "card_brand",
            "password_changed_at",
            "total",
            "zipper",
            "tipping",
        ] {
            assert_eq!(by_name(name), None, "{name}");
        }
    }

    #[test]
    fn values_show_their_kind() {
        let verdict = |vals: &[&str]| {
            let mut e = ValueEvidence::default();
            vals.iter().for_each(|v| e.add(v));
            e.verdict().map(|(k, _)| k)
        };
        assert_eq!(
            verdict(&["call me", "mail bob.smith@example.com please", "ok"]),
            Some(Kind::Email)
        );
        assert_eq!(verdict(&["GB82 WEST 1234 5698 7654 32"]), Some(Kind::Iban));
        assert_eq!(verdict(&["GB82WEST12345698765432"]), Some(Kind::Iban));
        assert_eq!(
            verdict(&["GB83WEST12345698765432"]),
            None,
            "bad check digits"
        );
        assert_eq!(verdict(&["paid 4111 1111 1111 1111 ok"]), Some(Kind::Card));
        assert_eq!(verdict(&["5500-0000-0000-0004"]), Some(Kind::Card));
        assert_eq!(verdict(&["4111111111111112"]), None, "fails Luhn");
        assert_eq!(
            verdict(&["order 1234567890123456"]),
            None,
            "no network prefix"
        );
        assert_eq!(
            verdict(&["+1 415-555-0100", "(030) 1234567", "n/a"]),
            Some(Kind::Phone)
        );
        assert_eq!(verdict(&["2024-01-05", "2023-12-31"]), None, "dates");
        assert_eq!(verdict(&["10.0.0.1", "2001:db8::1"]), Some(Kind::IpAddress));
        assert_eq!(verdict(&["1.4.2", "2.0.0"]), None, "versions");
        assert_eq!(
            verdict(&["eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"]),
            Some(Kind::Secret)
        );
        assert_eq!(verdict(&["hello world", "42", "12.50"]), None);
    }
}
